//! Coverage-guided fuzzing of node decoding: `cargo fuzz run decode_node` (needs cargo-fuzz).
//! Any input must decode to Ok or Corrupt; a panic is a bug.
#![no_main]
use idxfs_format::items;
use idxfs_format::node::{self, Expect};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Let the input also choose whether the checksum is made to match, so the checks behind it
    // are reached.
    let mut b = data.to_vec();
    if b.first().is_some_and(|x| x & 1 == 1) && b.len() > 4 {
        let c = crc32c_of(&b[4..]);
        b[..4].copy_from_slice(&c.to_le_bytes());
    }
    let exp = Expect { block: 10, generation: 3, owner: 1, level: None, fsid: [7; 16], total_blocks: 1 << 20 };
    if let Ok(c) = node::check(&b, &exp) {
        for i in 0..c.nritems() {
            if c.level() == 0 {
                let (k, v) = c.item(i);
                let _ = items::decode_inode(v, k.objectid);
                let _ = items::decode_dir_entries(v, "fuzz");
                let _ = items::decode_extent(v, "fuzz", 1 << 20);
                let _ = items::decode_xattrs(v, "fuzz");
                let _ = items::decode_names(v, "fuzz");
            } else {
                let _ = c.ptr(i);
            }
        }
    }
});

fn crc32c_of(b: &[u8]) -> u32 {
    // Castagnoli, bitwise: the fuzz crate stays free of extra dependencies.
    let mut crc = !0u32;
    for &x in b {
        crc ^= x as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}
