use clap::Parser;

/// nephele agent: enrol a device, then serve models locally and offload overflow.
#[derive(Parser)]
#[command(name = "nephele-edge", version)]
struct Cli {
    #[command(subcommand)]
    command: nephele_edge::EdgeCommand,
}

fn main() {
    let cli = Cli::parse();
    if let Err(error) = nephele_edge::run_cli(cli.command) {
        eprintln!("nephele-edge: error: {error:#}");
        std::process::exit(1);
    }
}
