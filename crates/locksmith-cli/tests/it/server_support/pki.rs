//! Certificates for the TLS tests, made in each test (no committed keys):
//! three certificate authorities and what they sign, as PEM files in a
//! temporary directory.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair,
};
use tempfile::TempDir;

/// Three certificate authorities and what they signed, as PEM files in a
/// temporary directory: `ca` (servers' and clients' certificates),
/// `members-ca` (cluster members' certificates) and `foreign-ca` (a
/// stranger's).
pub struct Pki {
    dir: TempDir,
    authorities: Vec<(String, CertificateParams, KeyPair)>,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("locksmith-pki-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temporary directory");
        let mut pki = Pki {
            dir,
            authorities: Vec::new(),
        };
        for name in ["ca", "members-ca", "foreign-ca"] {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name = common_name(name);
            let cert = params.self_signed(&key).unwrap();
            std::fs::write(pki.path(&format!("{name}.pem")), cert.pem()).unwrap();
            pki.authorities.push((name.to_owned(), params, key));
        }
        pki
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn path_str(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }

    /// A certificate for 127.0.0.1 and localhost named `CN=<name>`, usable
    /// as server and client certificate, signed by `ca`: `<name>.pem`,
    /// `<name>.key`.
    pub fn issue(&self, ca: &str, name: &str) {
        let (_, ca_params, ca_key) = self
            .authorities
            .iter()
            .find(|(n, _, _)| n == ca)
            .expect("a known CA");
        let issuer = Issuer::from_params(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        params.distinguished_name = common_name(name);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &issuer).unwrap();
        std::fs::write(self.path(&format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{name}.key")), key.serialize_pem()).unwrap();
    }

    /// `serve` arguments for TLS with `ca` for client certificates.
    pub fn serve_args(&self, server: &str) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.path_str(&format!("{server}.pem")),
            "--tls-key".into(),
            self.path_str(&format!("{server}.key")),
            "--tls-client-ca".into(),
            self.path_str("ca.pem"),
        ]
    }

    /// [`Pki::serve_args`] for a cluster member, whose certificate
    /// `members-ca` signed: that CA certifies members (`--tls-peer-ca`).
    pub fn member_serve_args(&self, member: &str) -> Vec<String> {
        let mut args = self.serve_args(member);
        args.extend(["--tls-peer-ca".into(), self.path_str("members-ca.pem")]);
        args
    }
}

pub fn common_name(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn
}
