//! Transport security of a job: TLS with client certificates (mutual TLS) on every gRPC
//! channel between its processes.
//!
//! The master issues a per-job certificate authority and one certificate for the job's
//! processes (or the user supplies all three files). Every process presents that
//! certificate and accepts only peers whose certificate the job's CA signed, so a process
//! of another job, or anything else on the network, can neither serve nor call. Addresses
//! are not in the certificate (pod IPs and Slurm hosts are known only once a node runs):
//! clients check the certificate against a fixed server name, [`SERVER_NAME`] by default.
//! The bearer token stays on top of TLS and tells the roles apart (see `rpc`).
//!
//! A process learns the material from its environment ([`CA_ENV`], [`CERT_ENV`],
//! [`KEY_ENV`], PEM text, delivered as engine secrets) and installs it once with
//! [`install`]; [`crate::channel`] and [`crate::server`] then use it.

use std::path::Path;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// Environment variable with the job CA's certificate (PEM).
pub const CA_ENV: &str = "ELASTREC_TLS_CA";
/// Environment variable with the job's certificate (PEM).
pub const CERT_ENV: &str = "ELASTREC_TLS_CERT";
/// Environment variable with the job certificate's private key (PEM).
pub const KEY_ENV: &str = "ELASTREC_TLS_KEY";
/// Environment variable with the name clients check the certificate against.
pub const NAME_ENV: &str = "ELASTREC_TLS_NAME";

/// The DNS name in a job certificate the master issues, which clients check.
pub const SERVER_NAME: &str = "elastrec-node";

/// When the job's channels use TLS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// On for every backend but `local` (whose traffic stays on loopback).
    #[default]
    Auto,
    /// Always on.
    On,
    /// Always off (only for a trusted network: tokens then travel in clear text).
    Off,
}

/// The `[engine.tls]` section.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// `auto` (on except on the local backend), `on` or `off`.
    pub mode: TlsMode,
    /// Your CA certificate (PEM file); empty: the master issues a CA for the job.
    pub ca: String,
    /// Your certificate for the job's processes, signed by `ca`, valid for server and
    /// client authentication and naming `server_name`.
    pub cert: String,
    /// The private key of `cert` (PEM file, keep it mode 0600).
    pub key: String,
    /// The name clients check the certificate against; empty: `elastrec-node`.
    pub server_name: String,
}

impl TlsConfig {
    /// True when the job's channels use TLS on a backend that is `local` or not.
    pub fn enabled(&self, local: bool) -> bool {
        match self.mode {
            TlsMode::Auto => !local,
            TlsMode::On => true,
            TlsMode::Off => false,
        }
    }
}

/// A job's TLS material: PEM text.
#[derive(Clone, PartialEq)]
pub struct TlsMaterial {
    /// The CA certificate peers must be signed by.
    pub ca: String,
    /// This job's certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
    /// The name clients check.
    pub server_name: String,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// Errors of TLS set-up, naming the file or variable at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Issuing the job's certificates failed.
    #[error("issuing the job's TLS certificates: {0}")]
    Issue(#[from] rcgen::Error),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The material is incomplete or not PEM.
    #[error("{0}")]
    Invalid(String),
    /// tonic refused the configuration.
    #[error("TLS configuration: {0}")]
    Transport(#[from] tonic::transport::Error),
}

impl TlsMaterial {
    /// Issues a new CA and a certificate for the job `job`, valid for server and client
    /// authentication under [`SERVER_NAME`] (and `localhost`).
    pub fn issue(job: &str) -> Result<Self, TlsError> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.distinguished_name
            .push(DnType::CommonName, format!("elastrec job {job} CA"));
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate()?;
        let mut leaf = CertificateParams::new(vec![SERVER_NAME.to_string(), "localhost".into()])?;
        leaf.distinguished_name
            .push(DnType::CommonName, format!("elastrec job {job}"));
        leaf.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        leaf.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = leaf.signed_by(&key, &issuer)?;
        Ok(Self {
            ca: ca_cert.pem(),
            cert: cert.pem(),
            key: key.serialize_pem(),
            server_name: SERVER_NAME.into(),
        })
    }

    /// The material `[engine.tls]` names (paths relative to `base`), or `None` when the
    /// master is to issue it.
    pub fn from_config(cfg: &TlsConfig, base: &Path) -> Result<Option<Self>, TlsError> {
        let given = [&cfg.ca, &cfg.cert, &cfg.key];
        if given.iter().all(|p| p.is_empty()) {
            return Ok(None);
        }
        if given.iter().any(|p| p.is_empty()) {
            return Err(TlsError::Invalid(
                "engine.tls: give all of ca, cert and key, or none (the master then issues them)"
                    .into(),
            ));
        }
        let read = |p: &String| {
            let path = base.join(p);
            std::fs::read_to_string(&path).map_err(|source| TlsError::File {
                path: path.display().to_string(),
                source,
            })
        };
        let m = Self {
            ca: read(&cfg.ca)?,
            cert: read(&cfg.cert)?,
            key: read(&cfg.key)?,
            server_name: if cfg.server_name.is_empty() {
                SERVER_NAME.into()
            } else {
                cfg.server_name.clone()
            },
        };
        m.check()?;
        Ok(Some(m))
    }

    /// Refuses material that is not PEM of the right kind.
    pub fn check(&self) -> Result<(), TlsError> {
        for (what, text, marker) in [
            ("CA certificate", &self.ca, "CERTIFICATE"),
            ("certificate", &self.cert, "CERTIFICATE"),
            ("private key", &self.key, "PRIVATE KEY"),
        ] {
            if !text.contains("-----BEGIN") || !text.contains(marker) {
                return Err(TlsError::Invalid(format!(
                    "the TLS {what} is not PEM ({marker})"
                )));
            }
        }
        Ok(())
    }

    /// The material as environment variables for a node (secret: an engine secret or
    /// the inherited environment, never argv).
    pub fn to_env(&self) -> Vec<(String, String)> {
        vec![
            (CA_ENV.into(), self.ca.clone()),
            (CERT_ENV.into(), self.cert.clone()),
            (KEY_ENV.into(), self.key.clone()),
            (NAME_ENV.into(), self.server_name.clone()),
        ]
    }

    /// The material from this process's environment, if any; an incomplete set is an
    /// error naming the missing variable.
    pub fn from_env() -> Result<Option<Self>, TlsError> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let (ca, cert, key) = (get(CA_ENV), get(CERT_ENV), get(KEY_ENV));
        if ca.is_none() && cert.is_none() && key.is_none() {
            return Ok(None);
        }
        let need = |v: Option<String>, k: &str| {
            v.ok_or_else(|| {
                TlsError::Invalid(format!("{k} is not set (the other TLS variables are)"))
            })
        };
        let m = Self {
            ca: need(ca, CA_ENV)?,
            cert: need(cert, CERT_ENV)?,
            key: need(key, KEY_ENV)?,
            server_name: get(NAME_ENV).unwrap_or_else(|| SERVER_NAME.into()),
        };
        m.check()?;
        Ok(Some(m))
    }

    /// Writes the material into `dir` (`ca.pem`, `cert.pem`, `key.pem` mode 0600,
    /// `server_name`), for `run --resume` and the admin commands.
    pub fn save(&self, dir: &Path) -> Result<(), TlsError> {
        let file = |name: &str, text: &str, private: bool| -> Result<(), TlsError> {
            let path = dir.join(name);
            let err = |source| TlsError::File {
                path: path.display().to_string(),
                source,
            };
            std::fs::create_dir_all(dir).map_err(err)?;
            write_file(&path, text.as_bytes(), private).map_err(err)
        };
        file("ca.pem", &self.ca, false)?;
        file("cert.pem", &self.cert, false)?;
        file("key.pem", &self.key, true)?;
        file("server_name", &self.server_name, false)
    }

    /// The material [`Self::save`] wrote into `dir`, if any.
    pub fn load(dir: &Path) -> Result<Option<Self>, TlsError> {
        if !dir.join("key.pem").exists() {
            return Ok(None);
        }
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| TlsError::File {
                path: path.display().to_string(),
                source,
            })
        };
        let m = Self {
            ca: read("ca.pem")?,
            cert: read("cert.pem")?,
            key: read("key.pem")?,
            server_name: read("server_name")?.trim().to_string(),
        };
        m.check()?;
        Ok(Some(m))
    }

    /// Client side: check the server against the CA and the name, present the job's
    /// certificate.
    pub fn client(&self) -> ClientTlsConfig {
        install_crypto_provider();
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .identity(Identity::from_pem(&self.cert, &self.key))
            .domain_name(self.server_name.clone())
    }

    /// Server side: present the job's certificate, require a client certificate the CA
    /// signed.
    pub fn server(&self) -> ServerTlsConfig {
        install_crypto_provider();
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert, &self.key))
            .client_ca_root(Certificate::from_pem(&self.ca))
    }
}

static INSTALLED: OnceLock<TlsMaterial> = OnceLock::new();

/// Makes aws-lc-rs this process's rustls crypto provider. The build compiles two providers
/// (the Kafka client's rustls feature brings ring's), and with two rustls will not choose:
/// a configuration built from the process default (tonic's server side) would panic.
/// Idempotent; a provider installed before stays.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Makes every channel and server of this process use `material` (once per process; a
/// second, different set is an error).
pub fn install(material: TlsMaterial) -> Result<(), TlsError> {
    material.check()?;
    let now = INSTALLED.get_or_init(|| material.clone());
    if *now != material {
        return Err(TlsError::Invalid(
            "another TLS configuration is already in use by this process".into(),
        ));
    }
    Ok(())
}

/// Installs the material from this process's environment, if any ([`TlsMaterial::from_env`]).
pub fn install_from_env() -> Result<bool, TlsError> {
    match TlsMaterial::from_env()? {
        Some(m) => install(m).map(|()| true),
        None => Ok(false),
    }
}

/// The material in use by this process, if any.
pub fn installed() -> Option<&'static TlsMaterial> {
    INSTALLED.get()
}

/// Writes `bytes` to `path`, readable only by the owner when `private`.
fn write_file(path: &Path, bytes: &[u8], private: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)?;
    f.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_material_is_pem_and_round_trips_through_files_and_env() {
        let m = TlsMaterial::issue("t").unwrap();
        m.check().unwrap();
        let dir = tempfile::tempdir().unwrap();
        m.save(dir.path()).unwrap();
        assert_eq!(TlsMaterial::load(dir.path()).unwrap(), Some(m.clone()));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("key.pem"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let env = m.to_env();
        assert!(env.iter().any(|(k, v)| k == KEY_ENV && v == &m.key));
    }

    #[test]
    fn partial_user_material_is_refused_naming_what_to_do() {
        let cfg = TlsConfig {
            ca: "ca.pem".into(),
            ..TlsConfig::default()
        };
        let err = TlsMaterial::from_config(&cfg, Path::new("/nonexistent"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("ca, cert and key"), "{err}");
        let cfg = TlsConfig {
            ca: "ca.pem".into(),
            cert: "c.pem".into(),
            key: "k.pem".into(),
            ..TlsConfig::default()
        };
        let err = TlsMaterial::from_config(&cfg, Path::new("/nonexistent"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn modes() {
        let auto = TlsConfig::default();
        assert!(!auto.enabled(true) && auto.enabled(false));
        let on = TlsConfig {
            mode: TlsMode::On,
            ..TlsConfig::default()
        };
        assert!(on.enabled(true));
    }
}
