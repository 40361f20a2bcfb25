//! The runbook manifest loader (YAML) and the trigger compiler.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nightshift_engine::embed::Manifest;
use nightshift_engine::embed::Compiled;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Manifest::parse(text, std::path::Path::new("fuzz.yaml")) {
        Ok(m) => {
            let _ = Compiled::from_manifest(&m);
        }
        Err(e) => {
            // Every refusal names the file.
            assert!(e.to_string().contains("fuzz.yaml"), "{e}");
        }
    }
});
