//! PyJWT, an implementation of JWT that shares no code with ours, as the tests' independent
//! verifier (`.ci/run` installs it).

/// Runs a Python `script` that reads the `parts` (joined by `"\n---\n"`) from stdin and prints a
/// JSON value; returns that value, or PyJWT's error (its stderr).
pub fn run(script: &str, parts: &[&str]) -> Result<serde_json::Value, String> {
    use std::io::Write;
    let mut child = std::process::Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("python3 with PyJWT is needed (.ci/run installs it): {e}"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(parts.join("\n---\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "PyJWT refused the token: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

/// Verifies an ES256 `token` with PyJWT against `jwks` (the key its `kid` names) and
/// `audience`; returns its claims.
pub fn verify_es256(
    token: &str,
    jwks: &serde_json::Value,
    audience: &str,
) -> Result<serde_json::Value, String> {
    let script = r#"
import json, sys, jwt
token, jwks, audience = sys.stdin.read().split("\n---\n")
keys = jwt.PyJWKSet.from_dict(json.loads(jwks))
kid = jwt.get_unverified_header(token)["kid"]
key = next(k for k in keys.keys if k.key_id == kid)
print(json.dumps(jwt.decode(token, key.key, algorithms=["ES256"], audience=audience.strip())))
"#;
    run(script, &[token, &jwks.to_string(), audience])
}
