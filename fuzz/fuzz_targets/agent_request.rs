//! The agent's request parser: any bytes an engine (or anyone with a key)
//! sends over the channel. Must return a request or a refusal, never panic;
//! what parses must survive a round trip through the wire format with the
//! same meaning (digest); a refusal must still make a well-formed reply.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nightshift_proto::{Reply, Request};

fuzz_target!(|data: &[u8]| {
    match Request::parse(data) {
        Ok(req) => {
            let again = Request::parse(req.to_json().as_bytes()).expect("a serialised request parses");
            assert_eq!(again.id, req.id);
            assert_eq!(again.digest(), req.digest());
        }
        Err(e) => {
            let reply = Reply::err(Request::salvage_id(data), e.code(), e.to_string());
            assert!(Reply::parse(reply.to_json().as_bytes()).is_ok());
        }
    }
});
