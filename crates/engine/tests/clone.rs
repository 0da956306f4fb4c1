//! `Fs::copy_range` (copy_file_range inside the file system), whose aligned copies share the
//! source's blocks (`fs/clone.rs`, counted by `fs/shared.rs`): against byte-vector models
//! of every file through random writes, copies (shared and not), truncates, punches,
//! preallocations, removals, fsyncs, commits and reopens, fsck clean with data sums read
//! at every reopen; deleting everything gives every block back; and a crash at every write
//! prefix of copies, overwrites and removals opens to a state a sync or fsync left, with
//! fsck clean (no block freed while another file names it, none leaked).
mod common;
use common::*;
use idxfs_blockdev::{BlockDevice, MemDevice, Tear};
use idxfs_engine::fs::{Fs, FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE};
use idxfs_engine::testutil::Rng;
use idxfs_engine::{fsck, Error};
use std::sync::Arc;

const BS: u64 = 4096;
/// Offsets stay below this, so ranges and copies overlap often.
const SPAN: u64 = 2 << 20;
const FILES: usize = 4;

fn used_blocks<D: BlockDevice + 'static>(dev: &Arc<D>) -> u64 {
    let dev: Arc<dyn BlockDevice> = dev.clone();
    fsck::check(&dev, idxfs_format::hash::name_hash, &mut |_| {})
        .expect("fsck")
        .used_blocks
}

fn check(fs: &Fs, inos: &[u64], models: &[Vec<u8>], what: &str) {
    for (i, (&ino, model)) in inos.iter().zip(models).enumerate() {
        let a = fs.getattr(ino).expect("getattr");
        assert_eq!(a.size, model.len() as u64, "file {i} size after {what}");
        let got = fs.read(ino, 0, model.len() + 8192).expect("read");
        if got != *model {
            let at = got.iter().zip(model).position(|(a, b)| a != b);
            panic!(
                "file {i} bytes differ after {what}: first at {at:?}, lengths {} {}",
                got.len(),
                model.len()
            );
        }
    }
}

/// Device blocks of `ino`'s written extents, as a set.
fn written_blocks(fs: &Fs, ino: u64) -> std::collections::BTreeSet<u64> {
    extent_blocks(fs, ino)
        .into_iter()
        .filter(|b| b.2 == idxfs_format::items::EXTENT_REGULAR)
        .map(|b| b.1)
        .collect()
}

#[test]
fn an_aligned_copy_shares_every_block_and_either_side_changes_alone() {
    let (dev, fs) = mem_fs(64 << 20);
    let a = fs.create(ROOT, b"a", 0o644, ME).expect("create").ino;
    let b = fs.create(ROOT, b"b", 0o644, ME).expect("create").ino;
    let mut rng = Rng::new(7);
    // Not a whole number of blocks: the last one is shared too, as the copy ends `b`.
    let data = rng.bytes(8 << 20 | 1234);
    fs.write(a, 0, &data).expect("write");
    fs.sync().expect("sync");
    let free = fs.statfs().expect("statfs").blocks_free;
    let n = fs
        .copy_range(a, 0, b, 0, u64::MAX / 2, Default::default())
        .expect("copy");
    assert_eq!(n, data.len() as u64, "copied up to the source's end");
    assert_eq!(fs.read(b, 0, data.len() + 1).expect("read"), data);
    assert_eq!(
        written_blocks(&fs, a),
        written_blocks(&fs, b),
        "the copy names the source's blocks"
    );
    fs.sync().expect("sync");
    let after = fs.statfs().expect("statfs").blocks_free;
    assert!(
        free - after < 64,
        "8 MiB copied took {} blocks (only its items should)",
        free - after
    );
    // Both count the blocks they name, as on btrfs and XFS.
    assert_eq!(
        fs.getattr(a).expect("getattr").blocks,
        fs.getattr(b).expect("getattr").blocks
    );
    // A write to either leaves the other as it was.
    fs.write(a, 4096 * 3 + 17, b"changed in a").expect("write");
    fs.write(b, 100, b"changed in b").expect("write");
    let mut want_a = data.clone();
    want_a[4096 * 3 + 17..4096 * 3 + 29].copy_from_slice(b"changed in a");
    let mut want_b = data.clone();
    want_b[100..112].copy_from_slice(b"changed in b");
    check(&fs, &[a, b], &[want_a.clone(), want_b.clone()], "writes");
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    check(&fs, &[a, b], &[want_a, want_b.clone()], "reopen");
    // The source goes; the copy keeps every byte, and its blocks.
    fs.unlink(ROOT, b"a").expect("unlink");
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    check(&fs, &[b], &[want_b], "the source removed");
    fs.unlink(ROOT, b"b").expect("unlink");
    fs.close().expect("close");
    assert_clean(&dev);
    let (fresh, fresh_fs) = mem_fs(64 << 20);
    fresh_fs.close().expect("close");
    // Every data block is back (the root's items may sit in other nodes: a few).
    let (now, was) = (used_blocks(&dev), used_blocks(&fresh));
    assert!(
        now <= was + 16,
        "{now} blocks in use after removing everything, {was} on a fresh image"
    );
}

#[test]
fn copies_that_share_match_a_model() {
    let (mut rng, seed) = Rng::from_env("clone model");
    eprintln!("IDXFS_SEED={seed}");
    let (dev, fs) = mem_fs(96 << 20);
    let mut fs = Some(fs);
    let mut inos = Vec::new();
    for i in 0..FILES {
        let f = fs.as_ref().expect("open");
        inos.push(
            f.create(ROOT, format!("f{i}").as_bytes(), 0o644, ME)
                .expect("create")
                .ino,
        );
    }
    let mut models: Vec<Vec<u8>> = vec![Vec::new(); FILES];
    let (mut shared, mut copied) = (0, 0);
    for step in 0..2500 {
        let f = fs.as_ref().expect("open");
        let i = rng.below(FILES as u64) as usize;
        let ino = inos[i];
        let off = rng.below(SPAN);
        let len = match rng.below(4) {
            0 => 1 + rng.below(64),
            1 => 1 + rng.below(BS * 2),
            _ => 1 + rng.below(BS * 64),
        };
        let end = (off + len) as usize;
        let what = match rng.below(12) {
            0..=2 => {
                let data = rng.bytes(len as usize);
                f.write(ino, off, &data).expect("write");
                if models[i].len() < end {
                    models[i].resize(end, 0);
                }
                models[i][off as usize..end].copy_from_slice(&data);
                "write".to_string()
            }
            3..=6 => {
                let j = rng.below(FILES as u64) as usize;
                // Mostly aligned (shared), sometimes not (copied byte by byte).
                let (so, doff) = if rng.chance(80) {
                    (off / BS * BS, rng.below(SPAN) / BS * BS)
                } else {
                    (off, rng.below(SPAN))
                };
                let len = if rng.chance(30) { u64::MAX / 4 } else { len };
                let src_len = models[j].len() as u64;
                let n = src_len.saturating_sub(so).min(len);
                let overlap = i == j && so < doff + n && doff < so + n;
                match f.copy_range(inos[j], so, ino, doff, len, Default::default()) {
                    Ok(got) => {
                        assert!(!overlap || n == 0, "step {step}: an overlapping copy ran");
                        assert_eq!(got, n, "step {step}: bytes copied");
                        let src: Vec<u8> = if n == 0 {
                            Vec::new()
                        } else {
                            models[j][so as usize..(so + n) as usize].to_vec()
                        };
                        let e = (doff + n) as usize;
                        if n > 0 {
                            if models[i].len() < e {
                                models[i].resize(e, 0);
                            }
                            models[i][doff as usize..e].copy_from_slice(&src);
                        }
                        if so % BS == 0 && doff % BS == 0 && n >= BS {
                            shared += 1;
                        } else {
                            copied += 1;
                        }
                    }
                    Err(Error::Invalid(_)) if overlap => {}
                    Err(e) => panic!("step {step}: copy {j}@{so} -> {i}@{doff} {len}: {e}"),
                }
                format!("copy {j}@{so} -> {i}@{doff} {len}")
            }
            7 => {
                let size = rng.below(SPAN);
                f.truncate(ino, size).expect("truncate");
                models[i].resize(size as usize, 0);
                "truncate".to_string()
            }
            8 => {
                f.fallocate(ino, off, len, FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE)
                    .expect("punch");
                let e = end.min(models[i].len());
                if (off as usize) < e {
                    models[i][off as usize..e].fill(0);
                }
                "punch".to_string()
            }
            9 => {
                f.fallocate(ino, off, len, 0).expect("preallocate");
                if models[i].len() < end {
                    models[i].resize(end, 0);
                }
                "preallocate".to_string()
            }
            10 => {
                // A file goes, and a new one takes its place (its blocks let go of).
                let name = format!("f{i}");
                f.unlink(ROOT, name.as_bytes()).expect("unlink");
                inos[i] = f
                    .create(ROOT, name.as_bytes(), 0o644, ME)
                    .expect("create")
                    .ino;
                models[i].clear();
                "replace".to_string()
            }
            _ => {
                f.fsync(ino).expect("fsync");
                "fsync".to_string()
            }
        };
        check(f, &inos, &models, &format!("step {step}: {what}"));
        if rng.chance(2) {
            f.sync().expect("sync");
        }
        if rng.chance(1) {
            fs.take().expect("open").close().expect("close");
            assert_clean(&dev);
            fs = Some(Fs::open(dev.clone(), opts()).expect("reopen"));
            check(
                fs.as_ref().expect("open"),
                &inos,
                &models,
                &format!("step {step}: reopen"),
            );
        }
    }
    assert!(
        shared > 150 && copied > 50,
        "the mix shares ({shared}) and copies ({copied})"
    );
    let f = fs.take().expect("open");
    for i in 0..FILES {
        f.unlink(ROOT, format!("f{i}").as_bytes()).expect("unlink");
    }
    f.close().expect("close");
    assert_clean(&dev);
    let (fresh, fresh_fs) = mem_fs(96 << 20);
    fresh_fs.close().expect("close");
    let (now, was) = (used_blocks(&dev), used_blocks(&fresh));
    assert!(
        now <= was + 16,
        "seed {seed}: {now} blocks in use after removing everything, {was} on a fresh image"
    );
}

#[test]
fn copies_refuse_what_they_must() {
    let (_dev, fs) = mem_fs(32 << 20);
    let a = fs.create(ROOT, b"a", 0o644, ME).expect("create").ino;
    let d = fs.mkdir(ROOT, b"d", 0o755, ME).expect("mkdir").ino;
    fs.write(a, 0, &[1u8; 3 * 4096]).expect("write");
    let k = Default::default();
    assert!(matches!(
        fs.copy_range(a, 0, d, 0, 10, k),
        Err(Error::IsDir)
    ));
    assert!(matches!(
        fs.copy_range(a, 0, a, 4096, 8192, k),
        Err(Error::Invalid(_))
    ));
    // Past the source's end: nothing, and no change.
    assert!(matches!(fs.copy_range(a, 1 << 20, a, 0, 10, k), Ok(0)));
    assert_eq!(fs.read(a, 0, 1 << 20).expect("read"), vec![1u8; 3 * 4096]);
    assert!(matches!(
        fs.copy_range(a, 0, a, 1 << 62, 10, k),
        Err(Error::FileTooBig)
    ));
}

/// A fixed script with random bytes and offsets: copies that share, overwrites and
/// truncates of shared files, each made durable by a sync or by fsyncs (the fsync log then
/// carries shared extents and their counts). Every crash from the first sync on opens, fsck
/// clean, to the last durable state or a later one, never an older one.
#[test]
fn a_crash_at_every_write_prefix_opens_to_a_synced_state() {
    let (mut rng, seed) = Rng::from_env("clone crash");
    let rec = recorded();
    let fs = Fs::open(rec.clone(), opts()).expect("open");
    let inos: Vec<u64> = [b"a", b"b", b"c"]
        .iter()
        .map(|n| fs.create(ROOT, *n, 0o644, ME).expect("create").ino)
        .collect();
    let mut m: Vec<Vec<u8>> = vec![Vec::new(); 3];
    m[0] = rng.bytes(96 * 4096);
    fs.write(inos[0], 0, &m[0]).expect("write");
    fs.sync().expect("sync");
    // (events at the durable point, what each file holds there)
    let mut states = vec![(rec.event_count(), m.clone())];
    // (what: 0 copy j -> i, 1 overwrite i, 2 truncate i to 0; i; j; durable by fsync)
    let script = [
        (0, 1, 0, false),
        (1, 0, 0, true),
        (0, 2, 1, true),
        (1, 1, 0, true),
        (2, 0, 0, true),
        (0, 0, 2, false),
        (1, 2, 0, true),
        (2, 1, 0, true),
        (2, 2, 0, true),
    ];
    for &(what, i, j, by_fsync) in &script {
        match what {
            0 => {
                let n = m[j].len() as u64;
                let got = fs
                    .copy_range(inos[j], 0, inos[i], 0, n, Default::default())
                    .expect("copy");
                assert_eq!(got, n);
                let src = m[j].clone();
                if m[i].len() < src.len() {
                    m[i].resize(src.len(), 0);
                }
                m[i][..src.len()].copy_from_slice(&src);
            }
            1 => {
                let off = rng.below(80 * 4096);
                let n = 1 + rng.below(40_000) as usize;
                let d = rng.bytes(n);
                fs.write(inos[i], off, &d).expect("write");
                let e = off as usize + n;
                if m[i].len() < e {
                    m[i].resize(e, 0);
                }
                m[i][off as usize..e].copy_from_slice(&d);
            }
            _ => {
                fs.truncate(inos[i], 0).expect("truncate");
                m[i].clear();
            }
        }
        if by_fsync {
            for &ino in &inos {
                fs.fsync(ino).expect("fsync");
            }
        } else {
            fs.sync().expect("sync");
        }
        states.push((rec.event_count(), m.clone()));
    }
    fs.close().expect("close");
    let end = rec.event_count();
    let (mut opened, mut replayed) = (0, 0);
    for prefix in states[0].0..=end {
        for tear in [Tear::None, Tear::Drop(rng.next_u64())] {
            let img = Arc::new(MemDevice::from_bytes(rec.crash_image(prefix, tear).bytes));
            assert_clean(&img);
            let f = Fs::open(img.clone(), opts()).expect("open");
            replayed += f.counters().log_replayed_batches.get();
            let got: Vec<Vec<u8>> = inos
                .iter()
                .map(|&ino| f.read(ino, 0, 1 << 20).expect("read"))
                .collect();
            let last = states.iter().rposition(|s| s.0 <= prefix).unwrap_or(0);
            assert!(
                states[last..].iter().any(|s| s.1 == got),
                "seed {seed} prefix {prefix} of {end} {tear:?}: not the state of durable point \
                 {last} or a later one"
            );
            f.close().expect("close");
            assert_clean(&img);
            opened += 1;
        }
    }
    assert!(
        opened > 50 && replayed > 20,
        "{opened} crash images, {replayed} log batches replayed"
    );
}

/// A full device overwrites a copy-on-write file's blocks in place rather than refuse a
/// write (`in_place.rs`), but never a shared block: that write is refused, and the other
/// file keeps its bytes.
#[test]
fn a_full_device_never_overwrites_a_shared_block_in_place() {
    let (dev, fs) = mem_fs(32 << 20);
    let a = fs.create(ROOT, b"a", 0o644, ME).expect("create").ino;
    let b = fs.create(ROOT, b"b", 0o644, ME).expect("create").ino;
    let data = vec![0x5A; 2 << 20];
    fs.write(a, 0, &data).expect("write");
    fs.copy_range(a, 0, b, 0, data.len() as u64, Default::default())
        .expect("copy");
    fs.sync().expect("sync");
    let c = fs.create(ROOT, b"c", 0o644, ME).expect("create").ino;
    let chunk = vec![1u8; 256 << 10];
    let mut off = 0;
    while fs.write(c, off, &chunk).is_ok() {
        off += chunk.len() as u64;
    }
    fs.sync().expect("sync");
    let mut refused = 0;
    for i in 0..64u64 {
        match fs.write(a, i * 16384, &[0xA5; 8192]) {
            Ok(_) => {}
            Err(Error::NoSpace) => refused += 1,
            Err(e) => panic!("write: {e}"),
        }
    }
    assert!(refused > 0, "the device was not full");
    assert!(
        fs.read(b, 0, data.len()).expect("read") == data,
        "a write to one file changed the other's shared blocks"
    );
    fs.close().expect("close");
    assert_clean(&dev);
}

/// The plan shares the source's partial last block because the copy ends the destination;
/// before the batch runs, the destination grows past the copy's end. That block's bytes
/// past the end are then the destination's own, so the batch copies it instead of sharing
/// it, and nothing written past the copy's end is lost.
#[test]
fn a_destination_that_grows_past_the_copy_before_its_batch_keeps_its_bytes() {
    use std::sync::mpsc::channel;
    use std::sync::Mutex;
    let dev = Arc::new(MemDevice::new(64 << 20));
    Fs::mkfs(dev.clone(), &Default::default()).expect("mkfs");
    // The hook tells the test the plan is made, and waits for it to go on.
    let (held_tx, held_rx) = channel::<()>();
    let (go_tx, go_rx) = channel::<()>();
    let (held_tx, go_rx) = (Mutex::new(held_tx), Mutex::new(go_rx));
    let hook = move || {
        let _ = held_tx.lock().expect("hook").send(());
        let _ = go_rx.lock().expect("hook").recv();
    };
    let o = idxfs_engine::OpenOptions {
        test_before_share: Some(Arc::new(hook)),
        ..opts()
    };
    let fs = Arc::new(Fs::open(dev.clone(), o).expect("open"));
    let a = fs.create(ROOT, b"a", 0o644, ME).expect("create").ino;
    let b = fs.create(ROOT, b"b", 0o644, ME).expect("create").ino;
    let data = Rng::new(11).bytes(3 * BS as usize + 100);
    fs.write(a, 0, &data).expect("write");
    fs.sync().expect("sync");
    let copier = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.copy_range(a, 0, b, 0, u64::MAX / 2, Default::default()))
    };
    held_rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the copy's plan");
    // Past the copy's end, in the block the plan meant to share.
    let past = data.len() as u64 + 50;
    fs.write(b, past, b"zz").expect("write past the copy");
    go_tx.send(()).expect("go");
    let n = copier.join().expect("copier").expect("copy");
    assert_eq!(n, data.len() as u64, "the whole source copied");
    let mut want = data.clone();
    want.resize(past as usize, 0);
    want.extend_from_slice(b"zz");
    check(&fs, &[a, b], &[data.clone(), want.clone()], "the copy");
    let (sa, sb) = (written_blocks(&fs, a), written_blocks(&fs, b));
    assert_eq!(
        sa.intersection(&sb).count(),
        3,
        "the whole blocks shared, the last one copied"
    );
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("fs still shared"));
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    check(&fs, &[a, b], &[data, want], "a reopen");
}

#[test]
fn a_copy_given_a_time_stops_after_its_batch_in_progress_and_the_rest_follows() {
    let (dev, fs) = mem_fs(96 << 20);
    let a = fs.create(ROOT, b"a", 0o644, ME).expect("create").ino;
    let mut rng = Rng::new(11);
    // Three batches and a bit (`CLONE_BATCH_BLOCKS` is 2,048 blocks).
    let data = rng.bytes((3 * 2048 + 5) * BS as usize + 77);
    fs.write(a, 0, &data).expect("write");
    let len = data.len() as u64;
    let kill = idxfs_engine::fs::Kill::default();
    // Aligned (shared) and unaligned (byte by byte, 1 MiB a chunk) copies, each asked for
    // the whole file at a time already passed: every call does one piece and returns it as
    // a short copy, and the calls together make the copy.
    for (name, at, piece) in [(&b"shared"[..], 0, 2048 * BS), (b"bytes", 3, 1 << 20)] {
        let b = fs.create(ROOT, name, 0o644, ME).expect("create").ino;
        let (mut done, mut calls) = (0, 0);
        while done < len {
            let now = std::time::Instant::now();
            let n = fs
                .copy_range_until(a, done, b, at + done, len - done, kill, Some(now))
                .expect("copy");
            assert!(n > 0, "a copy given no time still does one piece");
            assert!(
                n == piece || done + n == len,
                "{}: {n} bytes at {done}: not one piece ({piece}) or the rest",
                String::from_utf8_lossy(name)
            );
            done += n;
            calls += 1;
        }
        assert_eq!(calls, len.div_ceil(piece), "one call a piece");
        let mut want = vec![0u8; at as usize];
        want.extend_from_slice(&data);
        check(&fs, &[b], &[want], "copies piece by piece");
        // Without a time, one call does it all.
        let c = fs
            .create(ROOT, &[name, b"2"].concat(), 0o644, ME)
            .expect("create")
            .ino;
        assert_eq!(fs.copy_range(a, 0, c, at, len, kill).expect("copy"), len);
    }
    drop(fs);
    assert_clean(&dev);
}
