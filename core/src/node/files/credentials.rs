//! The credential set an SIA writes (docs/design.md §4.6): its file names, modes and owner, written
//! as one atomic [`FileSet`] swap. Re-exported from [`super`], where the swap lives.

use super::{FileSet, FileSpec, FilesError, Owner};

/// File name of the private key in a credential set.
pub const KEY_FILE: &str = "service.key.pem";
/// File name of the certificate (leaf then chain) in a credential set.
pub const CERT_FILE: &str = "service.cert.pem";
/// File name of the CA bundle in a credential set.
pub const CA_FILE: &str = "ca.cert.pem";
/// File name of the ntoken in a credential set.
pub const NTOKEN_FILE: &str = "ntoken";

/// The credentials an SIA writes (docs/design.md §4.6).
#[derive(Debug, Clone, Copy)]
pub struct Credentials<'a> {
    /// Private key PEM; `None` when the key lives elsewhere (control-plane SIA).
    pub key_pem: Option<&'a crate::secret::Secret>,
    /// Leaf certificate followed by the chain, PEM.
    pub cert_pem: &'a str,
    /// CA certificates, PEM.
    pub ca_pem: &'a str,
    /// ntoken.
    pub ntoken: &'a crate::secret::Secret,
}

/// Mode of the secret files of a set (keys, tokens): 0600, or 0640 when a group is given so a
/// non-root app in that group can read them.
pub fn secret_mode(owner: Option<Owner>) -> u32 {
    if owner.is_some_and(|o| o.gid.is_some()) {
        0o640
    } else {
        0o600
    }
}

/// The files of `creds`: `service.key.pem` and `ntoken` with [`secret_mode`],
/// `service.cert.pem` and `ca.cert.pem` 0644.
pub fn credential_files<'a>(creds: &Credentials<'a>, owner: Option<Owner>) -> Vec<FileSpec<'a>> {
    let secret_mode = secret_mode(owner);
    let mut files = Vec::with_capacity(4);
    if let Some(key) = creds.key_pem {
        files.push(FileSpec {
            name: KEY_FILE,
            contents: key.expose().as_bytes(),
            mode: secret_mode,
        });
    }
    files.push(FileSpec {
        name: CERT_FILE,
        contents: creds.cert_pem.as_bytes(),
        mode: 0o644,
    });
    files.push(FileSpec {
        name: CA_FILE,
        contents: creds.ca_pem.as_bytes(),
        mode: 0o644,
    });
    files.push(FileSpec {
        name: NTOKEN_FILE,
        contents: creds.ntoken.expose().as_bytes(),
        mode: secret_mode,
    });
    files
}

/// Writes `creds` ([`credential_files`]) into `set` as one atomic set, everything owned by
/// `owner` when given.
pub fn write_credentials(
    set: &FileSet,
    creds: &Credentials<'_>,
    owner: Option<Owner>,
) -> Result<(), FilesError> {
    set.write(&credential_files(creds, owner), owner)
}

/// Resolves `--group`: a numeric gid, or a group name looked up in the system's group database.
pub fn resolve_group(group: &str) -> Result<u32, String> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => Err(format!("group {group:?} does not exist")),
        Err(e) => Err(format!("looking up group {group:?}: {}", e.desc())),
    }
}
