//! The flex driver's argv as kubelet passes it (`mount <dir> <options json>` and the rest):
//! NUL separates the arguments. Must never panic; a refusal is one Failure reply.
#![no_main]

use athenz_volume_driver::Command;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args: Vec<&str> = if text.is_empty() {
        Vec::new()
    } else {
        text.split('\0').collect()
    };
    match Command::parse(&args) {
        Ok(Command::Mount { dir, options }) => {
            // what the parse promised: a normalised absolute dir and a valid pod
            assert!(dir.starts_with('/') && !dir.contains("/../") && !dir.contains("//"));
            assert!(!options.pod.pod_uid.is_empty());
        }
        Ok(_) => {}
        Err(reply) => {
            let line = reply.to_line();
            let parsed: serde_json::Value = serde_json::from_str(&line).expect("one JSON reply");
            // a refusal is Failure (exit 1) or, for a command the driver lacks, Not supported
            assert_ne!(parsed["status"], "Success");
            assert_eq!(reply.exit_code(), i32::from(parsed["status"] == "Failure"));
        }
    }
});
