//! Crash consistency at the device boundary: every prefix of a workload's device writes, and
//! every prefix with the writes since the last flush dropped, reordered or torn, opens to a
//! committed state that fsck passes, and that state is exactly what was committed.
mod common;
use common::digest::digest;
use common::*;
use idxfs_blockdev::{MemDevice, RecordingDevice, Tear};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{Fs, MkfsOptions};
use std::collections::HashMap;
use std::sync::Arc;

/// Runs a seeded workload with a commit every few operations; returns the digest after each
/// commit, keyed by the commit's generation.
fn workload(fs: &Fs, rng: &mut Rng, commits: usize) -> HashMap<u64, String> {
    let mut states = HashMap::new();
    let mut files: Vec<(u64, u64, Vec<u8>)> = Vec::new(); // (parent, ino, name)
    let mut dirs = vec![1u64];
    // Names carry a random base so repeated calls never collide.
    let mut n = rng.below(1 << 40);
    let gen = |fs: &Fs| fs.with_store(|s, _, _| s.generation - 1);
    states.insert(gen(fs), digest(fs));
    for _ in 0..commits {
        for _ in 0..rng.below(12) + 1 {
            n += 1;
            let parent = dirs[rng.below(dirs.len() as u64) as usize];
            match rng.below(11) {
                0 => {
                    let d = fs
                        .mkdir(parent, format!("d{n}").as_bytes(), 0o755, ME)
                        .expect("mkdir");
                    dirs.push(d.ino);
                }
                1..=4 => {
                    let name = format!("f{n}").into_bytes();
                    let a = fs.create(parent, &name, 0o644, ME).expect("create");
                    let len = [10usize, 3000, 9000, 70_000][rng.below(4) as usize];
                    let data = rng.bytes(len);
                    fs.write(a.ino, rng.below(5000), &data).expect("write");
                    files.push((parent, a.ino, name));
                }
                5 if !files.is_empty() => {
                    let i = rng.below(files.len() as u64) as usize;
                    let (p, _, name) = files.swap_remove(i);
                    fs.unlink(p, &name).expect("unlink");
                }
                6 if !files.is_empty() => {
                    let (p, _, name) = files[rng.below(files.len() as u64) as usize].clone();
                    let to = format!("r{n}").into_bytes();
                    fs.rename(p, &name, parent, &to, 0).expect("rename");
                    let i = files
                        .iter()
                        .position(|f| f.0 == p && f.2 == name)
                        .expect("known");
                    files[i].0 = parent;
                    files[i].2 = to;
                }
                7 if !files.is_empty() => {
                    let (_, ino, _) = files[rng.below(files.len() as u64) as usize].clone();
                    fs.truncate(ino, rng.below(20_000)).expect("truncate");
                }
                8 if !files.is_empty() => {
                    // Every size class: inline, a quarter item, chunked, the largest.
                    let (_, ino, _) = files[rng.below(files.len() as u64) as usize].clone();
                    let len = [40usize, 1500, 9000, 65536][rng.below(4) as usize];
                    let name = format!("user.k{}", rng.below(3));
                    fs.setxattr(ino, name.as_bytes(), &rng.bytes(len), 0)
                        .expect("setxattr");
                }
                9 if !files.is_empty() => {
                    // Long names of one inode in one directory: past the back-reference
                    // item's room, into extended references.
                    let (p, ino, _) = files[rng.below(files.len() as u64) as usize].clone();
                    link_long_names(fs, rng, (p, ino), &mut n, &mut files);
                }
                _ => {
                    let len = [11usize, 3000, 4095][rng.below(3) as usize];
                    let target: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                    fs.symlink(parent, format!("s{n}").as_bytes(), &target, ME)
                        .expect("symlink");
                }
            }
        }
        fs.sync().expect("sync");
        states.insert(gen(fs), digest(fs));
    }
    states
}

#[test]
fn every_prefix_opens_to_a_committed_state() {
    let (mut rng, seed) = Rng::from_env("crash every_prefix");
    let base_dev = Arc::new(MemDevice::new(16 << 20));
    Fs::mkfs(
        base_dev.clone(),
        &MkfsOptions {
            node_size: 4096,
            uuid: Some([3; 16]),
            ..Default::default()
        },
    )
    .expect("mkfs");
    let rec = Arc::new(RecordingDevice::new(base_dev.snapshot()));
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    let states = workload(&fs, &mut rng, 12);
    drop(fs);
    let events = rec.events();
    eprintln!(
        "seed {seed}: {} device events, {} committed states",
        events.len(),
        states.len()
    );
    assert!(events.len() > 30, "workload too small to be a test");
    // Generation made durable by each prefix: a commit is durable once the flush after its
    // superblock write is in the prefix.
    let mut checked = 0;
    for prefix in 0..=events.len() {
        let mut tears = vec![Tear::None, Tear::TornLast(1), Tear::TornLast(3)];
        for _ in 0..2 {
            tears.push(Tear::Drop(rng.next_u64()));
        }
        for tear in tears {
            let img = rec.crash_image(prefix, tear);
            let dev = Arc::new(MemDevice::from_bytes(img.bytes));
            let r = idxfs_engine::fsck::check(
                &(dev.clone() as Arc<dyn idxfs_blockdev::BlockDevice>),
                idxfs_format::hash::name_hash,
                &mut |_| {},
            )
            .unwrap_or_else(|e| {
                panic!("seed {seed} prefix {prefix} {tear:?}: fsck cannot read: {e}")
            });
            assert!(
                r.is_clean(),
                "seed {seed} prefix {prefix} {tear:?}: fsck problems:\n{}",
                r.problems.join("\n")
            );
            let fs = Fs::open(dev, opts()).unwrap_or_else(|e| {
                panic!("seed {seed} prefix {prefix} {tear:?}: open failed: {e}")
            });
            let gen = fs.with_store(|s, _, _| s.generation - 1);
            let want = states.get(&gen).unwrap_or_else(|| panic!("seed {seed} prefix {prefix} {tear:?}: opened generation {gen}, which was never committed"));
            assert_eq!(&digest(&fs), want, "seed {seed} prefix {prefix} {tear:?}: state of generation {gen} differs from what was committed");
            // The opened image must keep working: write and commit on top of it.
            fs.create(1, b"after-crash", 0o644, ME)
                .expect("create after crash");
            fs.sync().expect("sync after crash");
            checked += 1;
        }
    }
    eprintln!("seed {seed}: {checked} crash images checked");
}

#[test]
fn durable_commits_survive_any_later_crash() {
    // After sync() returns, no crash may lose that state: every later prefix opens to it or a
    // newer commit.
    let (mut rng, seed) = Rng::from_env("crash durable");
    let rec = recorded();
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    let mut durable = Vec::new(); // (event count when sync returned, generation)
    for _ in 0..6 {
        workload(&fs, &mut rng, 1);
        durable.push((rec.event_count(), fs.with_store(|s, _, _| s.generation - 1)));
    }
    drop(fs);
    let events = rec.event_count();
    for &(at, gen) in &durable {
        for prefix in at..=events {
            let img = rec.crash_image(prefix, Tear::Drop(rng.next_u64()));
            let fs = Fs::open(Arc::new(MemDevice::from_bytes(img.bytes)), opts()).expect("open");
            let got = fs.with_store(|s, _, _| s.generation - 1);
            assert!(got >= gen, "seed {seed}: generation {gen} was durable at event {at}, but prefix {prefix} opened {got}");
        }
    }
}
