//! A key's 128-bit tag: what dipamd's memories of recent requests (the DELs' tombstones, the
//! ADDs' births) hold in place of the key itself.
//!
//! Both hold one entry per request of the last ten minutes, up to 65,536 each. Kept as the
//! key (three strings, copied into each table and queue), they cost ~1 KB per ADD/DEL cycle
//! of those ten minutes: ~10 MiB at 16 cycles a second and ~65 MiB at their bounds, beside
//! the ~30 MiB dipamd holds for 2,500 pods (docs/performance.md run 42, lever 13). A tag is
//! 16 bytes.
//!
//! The tag is two SipHash-1-3 sums of the key under two keys drawn at random when the tagger
//! is made (std's `RandomState`), so a caller who knows none of them cannot aim two keys at
//! one tag; for two keys of 65,536 to share one by chance is about 2^-97. What a shared tag
//! would do is said where each memory is kept (births.rs, tombstones.rs).

use std::hash::{BuildHasher, Hash, RandomState};

/// A key's tag (see the module doc): two words, not a `u128`, whose 16-byte alignment would
/// pad every table entry that holds one.
pub type Tag = [u64; 2];

/// Tags keys under two random keys of its own.
#[derive(Debug, Default)]
pub struct Tagger {
    high: RandomState,
    low: RandomState,
}

impl Tagger {
    /// `key`'s tag under this tagger's keys.
    pub fn tag<K: Hash + ?Sized>(&self, key: &K) -> Tag {
        [self.high.hash_one(key), self.low.hash_one(key)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_has_one_tag_under_a_tagger_and_others_differ() {
        let t = Tagger::default();
        let a = ("net", "c1", "eth0");
        assert_eq!(t.tag(&a), t.tag(&("net", "c1", "eth0")));
        assert_ne!(t.tag(&a), t.tag(&("net", "c2", "eth0")));
        // Two taggers' keys are drawn apart: a tag says nothing across processes.
        assert_ne!(t.tag(&a), Tagger::default().tag(&a));
        // 100,000 keys, no two tags alike.
        let tags: std::collections::HashSet<Tag> =
            (0..100_000).map(|i| t.tag(&("net", i, "eth0"))).collect();
        assert_eq!(tags.len(), 100_000);
    }
}
