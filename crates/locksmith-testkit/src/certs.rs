//! [`Certificates`]: a test CA with a server certificate and client
//! certificates it signs, made with `openssl`, for servers started with TLS.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::find::{find_on_path, not_installed};
use crate::process::{self, give};
use crate::{Error, Result};

/// The files of a CA made for one server: its certificate, the server's
/// certificate and key, and any client certificates made with
/// [`Certificates::client`]. All keys are P-256, unencrypted PEM (PKCS#8),
/// valid for ten years.
#[derive(Debug, Clone)]
pub struct Certificates {
    dir: PathBuf,
    openssl: PathBuf,
    /// Who owns the files (a server that checks its key's owner runs as them).
    user: Option<(u32, u32)>,
}

/// The key options of every `openssl req`.
const KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

impl Certificates {
    /// Makes a CA in `dir` (created) and a server certificate signed by it
    /// naming `server_names` as subject alternative names (`DNS:localhost`,
    /// `IP:127.0.0.1`). `openssl` runs as `user` (`None`: this process's),
    /// so the files belong to it: PostgreSQL only reads a key that its own
    /// user owns with mode 0600.
    pub fn make(
        dir: &Path,
        server_names: &[&str],
        user: Option<(u32, u32)>,
    ) -> Result<Certificates> {
        let openssl = find_on_path("openssl").ok_or_else(|| not_installed("openssl", "openssl"))?;
        fs::create_dir(dir)
            .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
        give(dir, user)?;
        let certificates = Certificates {
            dir: dir.to_owned(),
            openssl,
            user,
        };
        certificates.openssl(
            &[
                &[
                    "req",
                    "-x509",
                    "-days",
                    "3650",
                    "-subj",
                    "/CN=locksmith test CA",
                ][..],
                &KEY,
                &["-keyout", "ca.key", "-out", "ca.crt"],
                &["-addext", "basicConstraints = critical, CA:TRUE"],
                &["-addext", "keyUsage = critical, keyCertSign, cRLSign"],
            ]
            .concat(),
        )?;
        let names = server_names.join(", ");
        certificates.sign(
            "server",
            "localhost",
            &format!("subjectAltName = {names}\nextendedKeyUsage = serverAuth\n"),
        )?;
        Ok(certificates)
    }

    /// Makes `<name>.key` and `<name>.crt`, signed by the CA, for `common_name`.
    fn sign(&self, name: &str, common_name: &str, extensions: &str) -> Result<()> {
        let extfile = self.dir.join(format!("{name}.ext"));
        fs::write(
            &extfile,
            format!(
                "basicConstraints = critical, CA:FALSE\n\
                 keyUsage = critical, digitalSignature\n{extensions}"
            ),
        )
        .map_err(|e| Error::io(format!("cannot write {}", extfile.display()), e))?;
        give(&extfile, self.user)?;
        let (key, csr, crt, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        self.openssl(
            &[
                &["req", "-subj", &format!("/CN={common_name}")][..],
                &KEY,
                &["-keyout", &key, "-out", &csr],
            ]
            .concat(),
        )?;
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ])
    }

    fn openssl(&self, args: &[&str]) -> Result<()> {
        process::run(
            Command::new(&self.openssl)
                .args(args)
                .current_dir(&self.dir),
            self.user,
        )
        .map(drop)
    }

    /// Makes a client certificate for `common_name` (for PostgreSQL, the
    /// database user) signed by the CA; returns its certificate and key
    /// files (`client-<common_name>.crt`, `.key`). When they belong to the
    /// server's user, this process reads them as root.
    pub fn client(&self, common_name: &str) -> Result<(PathBuf, PathBuf)> {
        let name = format!("client-{common_name}");
        self.sign(&name, common_name, "extendedKeyUsage = clientAuth\n")?;
        let (crt, key) = (
            self.dir.join(format!("{name}.crt")),
            self.dir.join(format!("{name}.key")),
        );
        Ok((crt, key))
    }

    /// Makes a certificate for a member of a cluster, which presents it both
    /// as a server and as a client (to its peers), naming `server_names`
    /// like the server's; returns its certificate and key files
    /// (`peer-<name>.crt`, `.key`).
    pub fn peer(&self, name: &str, server_names: &[&str]) -> Result<(PathBuf, PathBuf)> {
        let file = format!("peer-{name}");
        let names = server_names.join(", ");
        self.sign(
            &file,
            name,
            &format!("subjectAltName = {names}\nextendedKeyUsage = serverAuth, clientAuth\n"),
        )?;
        Ok((
            self.dir.join(format!("{file}.crt")),
            self.dir.join(format!("{file}.key")),
        ))
    }

    /// The CA's certificate (PEM), for clients to check the server with.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The server's certificate (PEM).
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// The server's key (PEM).
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }
}
