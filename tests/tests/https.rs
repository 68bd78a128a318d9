//! The REST API's transport: HTTPS by default with a certificate from the cluster CA,
//! the operator's own certificate when given, and plain HTTP only when asked for and
//! only on loopback. Real `nephele-cloud` processes; the `nephele` CLI says what is
//! wrong when a certificate is not trusted or a URL has the wrong scheme.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use nephele_e2e::{bin, temp_dir, trust_ca, Cloud, Http, TWO_REGIONS};

fn cli(api: &str, ca: Option<&std::path::Path>, token: &str) -> (bool, String) {
    let mut command = Command::new(bin("nephele"));
    command
        .args(["region", "list", "--api", api, "--token", token])
        .env_remove("NEPHELE_CA")
        .env(
            "NEPHELE_CLI_CONFIG",
            temp_dir("https-cli").join("none.toml"),
        );
    if let Some(ca) = ca {
        command.arg("--ca").arg(ca);
    }
    let output = command.output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

#[test]
fn the_api_is_https_with_the_cluster_ca_and_the_cli_says_what_to_trust() {
    let cloud = Cloud::start("https-default").unwrap();
    assert!(cloud.api.starts_with("https://"), "{}", cloud.api);
    // The CLI with the CA: answered.
    let (ok, said) = cli(&cloud.api, Some(&cloud.ca_path()), &cloud.token);
    assert!(ok && said.contains("eu-west"), "{said}");
    // Without it: refused at the TLS check, saying what to give.
    let (ok, said) = cli(&cloud.api, None, &cloud.token);
    assert!(
        !ok && said.contains("did not pass the TLS check") && said.contains("--ca FILE"),
        "{said}"
    );
    // http:// to the HTTPS API: not blamed on the network.
    let plain = format!("http://{}", cloud.addr());
    let (ok, said) = cli(&plain, None, &cloud.token);
    assert!(
        !ok && said.contains("did not answer plain HTTP") && said.contains("https://"),
        "{said}"
    );
    // Another cluster's CA does not verify this one's API.
    let other = Cloud::start("https-other").unwrap();
    let (ok, said) = cli(&cloud.api, Some(&other.ca_path()), &cloud.token);
    assert!(!ok && said.contains("TLS check"), "{said}");
}

#[test]
fn plain_http_is_served_only_when_asked_and_then_only_on_loopback() {
    let cloud =
        Cloud::start_with_args("https-plain", TWO_REGIONS, &["--plain-http".to_string()]).unwrap();
    assert!(cloud.api.starts_with("http://"), "{}", cloud.api);
    assert_eq!(
        cloud.get("/v1/regions").unwrap().as_array().unwrap().len(),
        2
    );
    assert!(cloud.logs().contains("plain HTTP"), "{}", cloud.logs());
    // https:// to it: said as such.
    let tls = format!("https://{}", cloud.addr());
    let (ok, said) = cli(&tls, Some(&cloud.ca_path()), &cloud.token);
    assert!(!ok && said.contains("did not answer TLS"), "{said}");
    // On every interface: refused at start, saying how to allow it.
    let dir = temp_dir("https-plain-any");
    let output = Command::new(bin("nephele-cloud"))
        .args([
            "--plain-http",
            "--api-listen",
            "0.0.0.0:0",
            "--quic-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        said.contains("only on a loopback address") && said.contains("--plain-http-any-address"),
        "{said}"
    );
}

#[test]
fn the_operators_own_certificate_is_served_when_given() {
    // An organisation's CA and a certificate it issued for the API's address.
    let dir = temp_dir("https-operator");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "example org CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let (cert, key, org_ca) = (
        dir.join("api.crt"),
        dir.join("api.key"),
        dir.join("org-ca.pem"),
    );
    std::fs::write(&cert, leaf.pem()).unwrap();
    std::fs::write(&key, leaf_key.serialize_pem()).unwrap();
    std::fs::write(&org_ca, ca_cert.pem()).unwrap();
    let args = [
        "--api-cert".to_string(),
        cert.display().to_string(),
        "--api-key".to_string(),
        key.display().to_string(),
    ];
    let cloud = Cloud::start_with_args("https-operator", TWO_REGIONS, &args).unwrap();
    // The organisation's CA verifies it; the cluster CA does not.
    let (ok, said) = cli(&cloud.api, Some(&org_ca), &cloud.token);
    assert!(ok && said.contains("eu-west"), "{said}");
    let (ok, said) = cli(&cloud.api, Some(&cloud.ca_path()), &cloud.token);
    assert!(!ok && said.contains("TLS check"), "{said}");
    trust_ca(&org_ca).unwrap();
    let (status, _, _) = Http::new(None)
        .get_full(&format!("{}/healthz", cloud.api))
        .unwrap();
    assert_eq!(status, 200);
    // A key that is not a key: refused at start, naming the file.
    std::fs::write(&key, "not a key").unwrap();
    let output = Command::new(bin("nephele-cloud"))
        .args([
            "--api-listen",
            "127.0.0.1:0",
            "--quic-listen",
            "127.0.0.1:0",
        ])
        .args(&args)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        said.contains("not a PEM private key") && said.contains("api.key"),
        "{said}"
    );
}
