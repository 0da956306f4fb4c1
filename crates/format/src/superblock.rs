//! The superblock: two copies at blocks 0 and 1. Commit `g` writes copy `g % 2`, so a torn
//! superblock write can only damage the copy being replaced; the other holds the previous commit.
use crate::versions::{COMPAT_RO_SUPPORTED, CURRENT_VERSION, INCOMPAT_SUPPORTED, MAGIC};
use crate::{ensure, Corrupt, BLOCK_SIZE, MAX_INO, MAX_NODE_SIZE, MIN_NODE_SIZE, SUPER_COPIES};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// A tree root pointer: block number, the generation that wrote it, and its level.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RootPtr {
    pub block: U64,
    pub generation: U64,
    pub level: U32,
    pub reserved: U32,
}
const _: () = assert!(size_of::<RootPtr>() == 24);

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Superblock {
    /// crc32c of the whole 4 KiB superblock block after this field (zero-filled tail included).
    pub csum: U32,
    pub version: U32,
    pub magic: [u8; 8],
    pub uuid: [u8; 16],
    pub incompat: U64,
    pub compat_ro: U64,
    pub compat: U64,
    /// Commit generation; the copy with the highest valid generation wins at open.
    pub generation: U64,
    /// Which copy this is (its block number); catches a copy written to the wrong place.
    pub copy_index: U64,
    pub block_size: U32,
    pub node_size: U32,
    pub total_blocks: U64,
    /// Blocks per block group; a free-space bitmap item covers exactly one group.
    pub group_blocks: U64,
    pub fs_root: RootPtr,
    pub space_root: RootPtr,
    /// The fsync log's first block (`log.rs`), with this commit's generation; block 0: none.
    pub log_root: RootPtr,
    pub next_ino: U64,
    pub used_blocks: U64,
    pub inode_count: U64,
    /// Metadata errors (a node that failed its checks or could not be read) met at run time
    /// since the image was last repaired, as ext4's error fields: a mount that meets one
    /// records it here. 0: none. `fsck` reports a non-zero count, `fsck --repair` clears it.
    pub errors: U64,
    /// When the first of `errors` was met, seconds since the Unix epoch (0 with no errors).
    pub first_error_time: U64,
    /// The roots tree (`TREE_ROOTS`: snapshots, shared node counts, held blocks); block 0:
    /// none (no snapshot was ever made). Incompat bit `INCOMPAT_SUBVOLUMES`.
    pub roots_root: RootPtr,
    /// Which writable tree `fs_root` is: 0 for the file system's own (`FS_SUBVOL_ID`), or a
    /// clone's id (`roots::SUBVOL_WRITABLE`). Incompat bit `INCOMPAT_CLONES`.
    pub subvolume: U64,
    pub reserved: [U64; 10],
}
pub const SUPERBLOCK_SIZE: usize =
    4 + 4 + 8 + 16 + 8 * 5 + 4 + 4 + 8 + 8 + 24 * 3 + 8 * 3 + 8 * 2 + 24 + 8 + 8 * 10;
const _: () = assert!(size_of::<Superblock>() == SUPERBLOCK_SIZE);
const _: () = assert!(SUPERBLOCK_SIZE <= BLOCK_SIZE as usize);

impl Superblock {
    /// Encodes into one full block with the checksum filled in.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; BLOCK_SIZE as usize];
        let mut sb = *self;
        sb.csum = U32::new(0);
        if let Some(dst) = out.get_mut(..SUPERBLOCK_SIZE) {
            dst.copy_from_slice(sb.as_bytes());
        }
        let csum = crc32c::crc32c(out.get(4..).unwrap_or(&[]));
        if let Some(dst) = out.get_mut(..4) {
            dst.copy_from_slice(&csum.to_le_bytes());
        }
        out
    }

    /// Decodes and validates one superblock copy read from block `copy`.
    pub fn decode(block: &[u8], copy: u64, device_blocks: u64) -> Result<Superblock, Corrupt> {
        let what = |f: &str| format!("superblock copy {copy} {f}");
        ensure!(
            block.len() == BLOCK_SIZE as usize,
            what("length"),
            block.len(),
            BLOCK_SIZE
        );
        let (sb, _) = Superblock::read_from_prefix(block)
            .map_err(|_| Corrupt::new(what("length"), block.len(), SUPERBLOCK_SIZE))?;
        ensure!(
            sb.magic == MAGIC,
            what("magic"),
            format!("{:02x?}", sb.magic),
            format!("{MAGIC:02x?} (not an idxfs image?)")
        );
        let csum = crc32c::crc32c(block.get(4..).unwrap_or(&[]));
        ensure!(
            sb.csum.get() == csum,
            what("checksum"),
            format!("{:#010x}", sb.csum.get()),
            format!("{csum:#010x}")
        );
        ensure!(
            sb.version.get() == CURRENT_VERSION,
            what("version"),
            sb.version.get(),
            CURRENT_VERSION
        );
        ensure!(
            sb.incompat.get() & !INCOMPAT_SUPPORTED == 0,
            what("incompat features"),
            format!("{:#x}", sb.incompat.get()),
            format!("subset of {INCOMPAT_SUPPORTED:#x}")
        );
        ensure!(
            sb.copy_index.get() == copy,
            what("copy index"),
            sb.copy_index.get(),
            copy
        );
        ensure!(
            sb.block_size.get() as u64 == BLOCK_SIZE,
            what("block size"),
            sb.block_size.get(),
            BLOCK_SIZE
        );
        let ns = sb.node_size.get();
        ensure!(
            ns.is_power_of_two() && (MIN_NODE_SIZE..=MAX_NODE_SIZE).contains(&ns),
            what("node size"),
            ns,
            format!("a power of two in {MIN_NODE_SIZE}..={MAX_NODE_SIZE}")
        );
        let total = sb.total_blocks.get();
        ensure!(
            total <= device_blocks,
            what("total blocks"),
            total,
            format!("<= device size {device_blocks} blocks (truncated image?)")
        );
        ensure!(
            total > SUPER_COPIES + 8,
            what("total blocks"),
            total,
            "at least 11"
        );
        let gb = sb.group_blocks.get();
        ensure!(
            gb.is_power_of_two() && gb >= 64 && gb / 8 <= ns as u64 / 2,
            what("group blocks"),
            gb,
            "a power of two, >= 64, whose bitmap fits half a node"
        );
        ensure!(
            sb.generation.get() >= 1,
            what("generation"),
            sb.generation.get(),
            ">= 1"
        );
        let next = sb.next_ino.get();
        ensure!(
            next > crate::ROOT_INO && next <= MAX_INO,
            what("next inode"),
            next,
            format!("in 2..={MAX_INO}")
        );
        ensure!(
            sb.used_blocks.get() <= total,
            what("used blocks"),
            sb.used_blocks.get(),
            format!("<= {total}")
        );
        for (name, r) in [("fs root", &sb.fs_root), ("space root", &sb.space_root)] {
            check_root(r, &what(name), &sb)?;
        }
        if sb.roots_root.block.get() != 0 {
            ensure!(
                sb.incompat.get() & crate::versions::INCOMPAT_SUBVOLUMES != 0,
                what("roots root"),
                sb.roots_root.block.get(),
                "0 (the image has no subvolumes feature)"
            );
            check_root(&sb.roots_root, &what("roots root"), &sb)?;
        }
        let sub = sb.subvolume.get();
        if sub != 0 {
            ensure!(
                sb.incompat.get() & crate::versions::INCOMPAT_CLONES != 0
                    && sb.roots_root.block.get() != 0
                    && (crate::FIRST_SNAPSHOT_ID..=MAX_INO).contains(&sub),
                what("subvolume"),
                sub,
                "0, or a clone's id in an image with clones and a roots tree"
            );
        }
        let log = sb.log_root.block.get();
        if log != 0 {
            ensure!(
                sb.incompat.get() & crate::versions::INCOMPAT_LOG != 0,
                what("log root"),
                log,
                "0 (the image has no log feature)"
            );
            ensure!(
                log >= SUPER_COPIES && log < total,
                what("log root block"),
                log,
                format!("in {SUPER_COPIES}..{total}")
            );
            ensure!(
                sb.log_root.generation.get() == sb.generation.get(),
                what("log root generation"),
                sb.log_root.generation.get(),
                sb.generation.get()
            );
        }
        Ok(sb)
    }

    /// True when the image carries read-only-compatible features this code does not know:
    /// it may be read but must not be written.
    pub fn unknown_compat_ro(&self) -> bool {
        self.compat_ro.get() & !COMPAT_RO_SUPPORTED != 0
    }

    pub fn blocks_per_node(&self) -> u64 {
        self.node_size.get() as u64 / BLOCK_SIZE
    }
}

fn check_root(r: &RootPtr, what: &str, sb: &Superblock) -> Result<(), Corrupt> {
    let b = r.block.get();
    let bpn = sb.node_size.get() as u64 / BLOCK_SIZE;
    ensure!(
        b >= SUPER_COPIES
            && b.checked_add(bpn)
                .is_some_and(|e| e <= sb.total_blocks.get()),
        format!("{what} block"),
        b,
        format!("in {SUPER_COPIES}..{}", sb.total_blocks.get())
    );
    ensure!(
        r.generation.get() <= sb.generation.get(),
        format!("{what} generation"),
        r.generation.get(),
        format!("<= {}", sb.generation.get())
    );
    ensure!(
        r.level.get() < crate::node::MAX_LEVEL as u32,
        format!("{what} level"),
        r.level.get(),
        format!("< {}", crate::node::MAX_LEVEL)
    );
    Ok(())
}
