//! Fuzz the tracer: the first byte picks the entry point (even: the protocol parsers driven by a
//! script of segments, see `fuzzing::parsers`; odd: the whole capture pipeline over the bytes as a
//! pcap/pcapng file). Run: `cargo +nightly fuzz run parsers` (in engine/).
#![no_main]

use libfuzzer_sys::fuzz_target;

// The tracer's modules, compiled here from the engine's own sources (the engine is a binary crate).
#[allow(dead_code)]
mod trace {
    #[path = "../../../src/trace/exchange.rs"]
    pub mod exchange;
    #[path = "../../../src/trace/framer.rs"]
    pub mod framer;
    #[path = "../../../src/trace/fuzzing.rs"]
    pub mod fuzzing;
    #[path = "../../../src/trace/http.rs"]
    pub mod http;
    #[path = "../../../src/trace/label.rs"]
    pub mod label;
    #[path = "../../../src/trace/mysql.rs"]
    pub mod mysql;
    #[path = "../../../src/trace/net.rs"]
    pub mod net;
    #[path = "../../../src/trace/pcap.rs"]
    pub mod pcap;
    #[path = "../../../src/trace/postgres.rs"]
    pub mod postgres;
    #[path = "../../../src/trace/servermap.rs"]
    pub mod servermap;
    #[path = "../../../src/trace/tcp.rs"]
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
