//! FxHash for the tracer's hash maps (flow keys, label and dictionary caches): fast and not
//! cryptographic. Its own module so that the connection tracker (`tcp`) and the modules it
//! drives (`label` through the protocol parsers, `output`) share it without importing each other.

use std::hash::{BuildHasherDefault, Hasher};

/// FxHash: a fast non-cryptographic hash for flow keys.
#[derive(Default, Clone, Copy)]
pub struct Fx(u64);
impl Hasher for Fx {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut v = [0u8; 8];
            v[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(v));
        }
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}
pub type FxBuild = BuildHasherDefault<Fx>;
