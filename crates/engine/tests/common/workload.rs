//! A random workload of every kind of change (files of every size, NOCOW files overwritten
//! in place, preallocation, copies that share blocks, truncates, punches, renames, xattrs),
//! for the tests of trees that share blocks (snapshots, clones), and fsck after it.
use super::*;
use idxfs_blockdev::{BlockDevice, MemDevice, RecordingDevice, Tear};
use idxfs_engine::fs::{Fs, FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE, NOCOW_FL};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{fsck, Error};
use std::sync::Arc;

/// Files the workload knows: (parent, ino, name).
#[derive(Default, Clone)]
pub struct World {
    pub files: Vec<(u64, u64, Vec<u8>)>,
    pub dirs: Vec<u64>,
    pub n: u64,
    /// Also fsync now and then (not in the crash test, whose states are commits).
    pub fsync: bool,
}

/// One random change.
pub fn step(fs: &Fs, rng: &mut Rng, w: &mut World) {
    w.n += 1;
    let n = w.n;
    if w.dirs.is_empty() {
        w.dirs.push(ROOT);
    }
    let parent = w.dirs[rng.below(w.dirs.len() as u64) as usize];
    let pick = |rng: &mut Rng, w: &World| {
        (!w.files.is_empty()).then(|| w.files[rng.below(w.files.len() as u64) as usize].clone())
    };
    match rng.below(14) {
        0 => {
            let d = fs
                .mkdir(parent, format!("d{n}").as_bytes(), 0o755, ME)
                .expect("mkdir");
            w.dirs.push(d.ino);
        }
        1..=3 => {
            let name = format!("f{n}").into_bytes();
            let a = fs.create(parent, &name, 0o644, ME).expect("create");
            if rng.chance(25) {
                fs.set_flags(a.ino, NOCOW_FL).expect("chattr +C");
            }
            let len = [10usize, 3000, 9000, 70_000, 200_000][rng.below(5) as usize];
            fs.write(a.ino, rng.below(5000), &rng.bytes(len))
                .expect("write");
            w.files.push((parent, a.ino, name));
        }
        4 | 5 => {
            // Overwrites: a NOCOW file's go in place unless a snapshot may name the blocks.
            if let Some((_, ino, _)) = pick(rng, w) {
                let size = fs.getattr(ino).expect("getattr").size;
                let off = rng.below(size.max(1));
                let len = [1usize, 4096, 20_000][rng.below(3) as usize];
                fs.write(ino, off, &rng.bytes(len)).expect("overwrite");
            }
        }
        6 => {
            if let Some((p, _, name)) = pick(rng, w) {
                fs.unlink(p, &name).expect("unlink");
                w.files.retain(|f| !(f.0 == p && f.2 == name));
            }
        }
        7 => {
            if let Some((_, ino, _)) = pick(rng, w) {
                fs.truncate(ino, rng.below(100_000)).expect("truncate");
            }
        }
        8 => {
            if let Some((_, ino, _)) = pick(rng, w) {
                let (off, len) = (rng.below(100_000), rng.below(60_000) + 1);
                fs.fallocate(ino, off, len, 0).expect("preallocate");
            }
        }
        9 => {
            if let Some((_, ino, _)) = pick(rng, w) {
                let (off, len) = (rng.below(100_000), rng.below(60_000) + 1);
                fs.fallocate(ino, off, len, FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE)
                    .expect("punch");
            }
        }
        10 => {
            // A copy that shares blocks (refused for NOCOW files, as on btrfs).
            if let (Some((_, a, _)), Some((_, b, _))) = (pick(rng, w), pick(rng, w)) {
                let len = rng.below(80_000);
                match fs.copy_range(a, 0, b, rng.below(8) * 4096, len, Default::default()) {
                    Ok(_) | Err(Error::Invalid(_)) => {}
                    Err(e) => panic!("copy_range: {e}"),
                }
            }
        }
        11 => {
            if let Some((p, _, name)) = pick(rng, w) {
                let to = format!("r{n}").into_bytes();
                fs.rename(p, &name, parent, &to, 0).expect("rename");
                if let Some(f) = w.files.iter_mut().find(|f| f.0 == p && f.2 == name) {
                    f.0 = parent;
                    f.2 = to;
                }
            }
        }
        12 => {
            if let Some((_, ino, _)) = pick(rng, w) {
                let len = [40usize, 9000][rng.below(2) as usize];
                fs.setxattr(ino, b"user.k", &rng.bytes(len), 0)
                    .expect("setxattr");
            }
        }
        _ => {
            fs.symlink(parent, format!("s{n}").as_bytes(), b"target", ME)
                .expect("symlink");
        }
    }
    if w.fsync && rng.chance(10) {
        if let Some((_, ino, _)) = pick(rng, w) {
            fs.fsync(ino).expect("fsync");
        }
    }
}

pub fn check(dev: &Arc<MemDevice>, at: &str) {
    let r = fsck::check(
        &(dev.clone() as Arc<dyn BlockDevice>),
        idxfs_format::hash::name_hash,
        &mut |_| {},
    )
    .unwrap_or_else(|e| panic!("{at}: fsck cannot read: {e}"));
    assert!(
        r.is_clean(),
        "{at}: fsck problems:\n{}",
        r.problems.join("\n")
    );
}

/// Every crash image of what `rec` recorded: each prefix of its events, whole, with the last
/// write torn, and with the unflushed writes dropped at random; each fsck'd, then given to
/// `f` with its name for messages. Returns how many there were.
pub fn every_crash_image(
    rec: &RecordingDevice,
    rng: &mut Rng,
    seed: u64,
    mut f: impl FnMut(Arc<MemDevice>, &str),
) -> usize {
    let events = rec.events();
    eprintln!("seed {seed}: {} device events", events.len());
    let mut checked = 0;
    for prefix in 0..=events.len() {
        for tear in [Tear::None, Tear::TornLast(1), Tear::Drop(rng.next_u64())] {
            let at = format!("seed {seed} prefix {prefix} {tear:?}");
            let img = rec.crash_image(prefix, tear);
            let dev = Arc::new(MemDevice::from_bytes(img.bytes));
            check(&dev, &at);
            f(dev, &at);
            checked += 1;
        }
    }
    eprintln!("seed {seed}: {checked} crash images checked");
    checked
}
