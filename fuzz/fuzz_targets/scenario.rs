//! The scenario loader (YAML handbook tests).
#![no_main]
use libfuzzer_sys::fuzz_target;
use nightshift_sim::scenario::Scenario;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = Scenario::parse(text, std::path::Path::new("fuzz.yaml")) {
        assert!(e.to_string().contains("fuzz.yaml"), "{e}");
    }
});
