//! Smoke fuzzing of every decoder that reads disk bytes: random and mutated inputs must give
//! Ok or Corrupt, never a panic. (The coverage-guided target lives in `fuzz/`.)
use idxfs_format::items;
use idxfs_format::node::{self, Expect, Identity};
use idxfs_format::superblock::Superblock;
use idxfs_format::{ItemType, Key};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn exp() -> Expect {
    Expect {
        block: 10,
        generation: 3,
        owner: 1,
        level: None,
        fsid: [7; 16],
        total_blocks: 100_000,
        range: node::KeyRange::ANY,
    }
}

fn reseal(b: &mut [u8]) {
    let c = crc32c::crc32c(&b[4..]);
    b[..4].copy_from_slice(&c.to_le_bytes());
}

#[test]
fn mutated_nodes_never_panic() {
    let seed = std::env::var("IDXFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9e3779b97f4a7c15u64);
    eprintln!("decode fuzz seed {seed}");
    let mut rng = Rng(seed | 1);
    let keys: Vec<Key> = (0..40)
        .map(|i| Key::new(i, ItemType::DirHash, i * 3))
        .collect();
    // Values of every record kind, so mutations hit their parsers mid-record.
    let long = items::encode_xattrs(&[
        items::XattrEntry {
            name: b"user.a".to_vec(),
            value: items::XattrValue::Inline(vec![3; 20]),
        },
        items::XattrEntry {
            name: b"user.long".to_vec(),
            value: items::XattrValue::Chunked {
                len: 40_000,
                base: 0x4400,
            },
        },
    ]);
    let mut ext = Vec::new();
    items::encode_ext_ref(&mut ext, 77, b"name-one");
    items::encode_ext_ref(&mut ext, 78, b"two");
    let vals: Vec<Vec<u8>> = (0..40)
        .map(|i| match i % 5 {
            0 => long.clone(),
            1 => ext.clone(),
            _ => vec![i as u8; (i % 7) * 9],
        })
        .collect();
    let id = Identity {
        block: 10,
        generation: 3,
        owner: 1,
        fsid: [7; 16],
    };
    let mut leaf = vec![0u8; 4096];
    node::encode_leaf(
        &mut leaf,
        &id,
        keys.iter().zip(vals.iter().map(|v| v.as_slice())),
    );
    let mut internal = vec![0u8; 4096];
    node::encode_internal(
        &mut internal,
        &id,
        1,
        (0..30u32).map(|i| (Key::new(i as u64, ItemType::Inode, 0), 100 + i as u64, 2)),
    );
    let mut accepted = 0;
    for round in 0..100_000 {
        let mut b = if round % 2 == 0 {
            leaf.clone()
        } else {
            internal.clone()
        };
        for _ in 0..(rng.next() % 8 + 1) {
            let at = (rng.next() % b.len() as u64) as usize;
            b[at] = rng.next() as u8;
        }
        // Mostly re-sealed, so the checks behind the checksum are exercised too.
        if !rng.next().is_multiple_of(4) {
            reseal(&mut b);
        }
        if rng.next().is_multiple_of(16) {
            b.truncate((rng.next() % 4096) as usize);
        }
        if let Ok(c) = node::check(&b, &exp()) {
            accepted += 1;
            for i in 0..c.nritems() {
                if c.level() == 0 {
                    let (k, v) = c.item(i);
                    let _ = items::decode_dir_entries(v, "fuzz");
                    let _ = items::decode_inode(v, k.objectid);
                    let _ = items::decode_extent(v, "fuzz", 100_000);
                    let _ = items::decode_xattrs(v, "fuzz");
                    let _ = items::decode_names(v, "fuzz");
                    let _ = items::decode_ext_refs(v, "fuzz");
                    let _ = items::decode_orphan(v, k.objectid);
                    if let Ok(s) = items::BlockSums::decode(v, "fuzz") {
                        assert_eq!(s.encode().as_deref(), Some(v), "sums re-encode as read");
                    }
                } else {
                    let _ = c.ptr(i);
                }
            }
        }
    }
    // Mutations in item data pass the node checks; the item decoders must then cope.
    assert!(
        accepted > 1000,
        "too few mutated nodes reached the item decoders: {accepted}"
    );
}

#[test]
fn random_superblocks_never_panic() {
    let mut rng = Rng(12345);
    for _ in 0..20_000 {
        let mut b: Vec<u8> = (0..4096).map(|_| rng.next() as u8).collect();
        b[8..16].copy_from_slice(&idxfs_format::versions::MAGIC);
        reseal(&mut b);
        let _ = Superblock::decode(&b, 0, 1 << 20);
        let _ = Superblock::decode(&b[..(rng.next() % 4096) as usize], 1, 1 << 20);
    }
}
