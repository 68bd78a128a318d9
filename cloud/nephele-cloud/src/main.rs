use clap::Parser;

/// nephele control plane: regions, QUIC gateway for agents, REST API.
#[derive(Parser)]
#[command(name = "nephele-cloud", version)]
struct Cli {
    #[command(flatten)]
    args: nephele_cloud::CloudArgs,
}

fn main() {
    let cli = Cli::parse();
    if let Err(error) = nephele_cloud::run_cli(cli.args) {
        eprintln!("nephele-cloud: error: {error:#}");
        std::process::exit(1);
    }
}
