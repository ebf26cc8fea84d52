//! Cross-checks with the real `openssl` command-line tool, so that what this system produces is
//! judged by an implementation other than the one that made it. `.ci/run` installs openssl.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs `openssl` with `args`, feeding `stdin`; returns stdout, or stderr as the error.
pub fn run(args: &[&str], stdin: &[u8]) -> Result<String, String> {
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run openssl (is it installed?): {e}"))?;
    if let Some(mut input) = child.stdin.take() {
        input
            .write_all(stdin)
            .map_err(|e| format!("writing to openssl: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for openssl: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(format!("{stdout}{stderr}"))
    } else {
        Err(format!("openssl {args:?} failed: {stderr}{stdout}"))
    }
}

/// `openssl req -verify -noout -text` of a PEM CSR: checks its signature and prints it.
///
/// OpenSSL 3.0 exits 0 even when the self-signature does not verify, so the verdict is read from
/// its output.
pub fn csr_text(csr_pem: &str) -> Result<String, String> {
    let out = run(&["req", "-verify", "-noout", "-text"], csr_pem.as_bytes())?;
    if out.contains("self-signature verify OK") {
        Ok(out)
    } else {
        Err(format!("openssl did not verify the CSR: {out}"))
    }
}

/// `openssl x509 -noout -text` of a PEM certificate.
pub fn cert_text(cert_pem: &str) -> Result<String, String> {
    run(&["x509", "-noout", "-text"], cert_pem.as_bytes())
}

/// `openssl verify -CAfile <root> [-untrusted <intermediates>] <leaf>`: checks a certificate
/// chains to `root_pem`.
pub fn verify(root_pem: &str, intermediates_pem: &str, leaf_pem: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let write = |name: &str, text: &str| -> Result<String, String> {
        let path = dir.path().join(name);
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        Ok(path_str(&path))
    };
    let root = write("root.pem", root_pem)?;
    let leaf = write("leaf.pem", leaf_pem)?;
    let mut args = vec!["verify", "-CAfile", root.as_str()];
    let untrusted;
    if !intermediates_pem.is_empty() {
        untrusted = write("untrusted.pem", intermediates_pem)?;
        args.extend(["-untrusted", untrusted.as_str()]);
    }
    args.push(leaf.as_str());
    let out = run(&args, b"")?;
    if out.contains(": OK") {
        Ok(())
    } else {
        Err(out)
    }
}

/// `openssl dgst -sha256 -verify <public key> -signature <sig>` over `data`: checks a SHA-256
/// RSA or ECDSA signature as any other Athenz implementation would.
pub fn verify_sha256_signature(
    public_key_pem: &str,
    signature: &[u8],
    data: &[u8],
) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let public = dir.path().join("pub.pem");
    let sig = dir.path().join("sig.bin");
    std::fs::write(&public, public_key_pem).map_err(|e| e.to_string())?;
    std::fs::write(&sig, signature).map_err(|e| e.to_string())?;
    let (public, sig) = (path_str(&public), path_str(&sig));
    let out = run(
        &["dgst", "-sha256", "-verify", &public, "-signature", &sig],
        data,
    )?;
    if out.contains("Verified OK") {
        Ok(())
    } else {
        Err(out)
    }
}

fn path_str(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}
