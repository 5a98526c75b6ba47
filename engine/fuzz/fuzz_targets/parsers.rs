//! Fuzz the tracer: the first byte picks the entry point (even: the protocol parsers driven by a
//! script of segments, see `fuzzing::parsers`; odd: the whole capture pipeline over the bytes as a
//! pcap/pcapng file). Run: `cargo +nightly fuzz run parsers` (in engine/).
#![no_main]

use libfuzzer_sys::fuzz_target;

// The tracer's modules, compiled here from the engine's own sources (the engine is a binary crate).
#[allow(dead_code)]
#[path = "../../src/trace"]
mod trace {
    pub mod exchange;
    pub mod framer;
    pub mod hash;
    pub mod fuzzing;
    pub mod http;
    pub mod label;
    pub mod mysql;
    pub mod net;
    pub mod pcap;
    pub mod postgres;
    pub mod servermap;
    pub mod tcp;
}

fuzz_target!(|data: &[u8]| {
    if let Some((&sel, rest)) = data.split_first() {
        if sel & 1 == 0 {
            trace::fuzzing::parsers(rest);
        } else {
            trace::fuzzing::capture(rest);
        }
    }
});
