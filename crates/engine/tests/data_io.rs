//! File data I/O outside the operation lock (`fs/data_io.rs`): what a reader or writer in the
//! middle of its device I/O may see other operations do, forced step by step at a device
//! gate, then random concurrent reads and writes checked against models.
mod common;
use common::{assert_clean, opts, ME, ROOT};
use idxfs_blockdev::{BlockDevice, MemDevice, RecordingDevice, Tear};
use idxfs_engine::fs::NOCOW_FL;
use idxfs_engine::testutil::Rng;
use idxfs_engine::{Fs, MkfsOptions, OpenOptions};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BS: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Io {
    Read,
    Write,
}

/// An armed gate: what it waits for (a length, or any that is not a node's), and (told when
/// held, told to go on).
type Armed = Option<(Io, Option<usize>, Sender<()>, Receiver<()>)>;

/// Holds the next read or write of exactly `len` bytes until told to go on. Node I/O comes in
/// multiples of the 16 KiB node size, so a length that is not one picks out file data.
struct Gate {
    inner: Arc<RecordingDevice>,
    armed: Mutex<Armed>,
}

impl Gate {
    /// Arms the gate: returns (told when the I/O is held, tell it to go on).
    fn arm(&self, io: Io, len: Option<usize>) -> (Receiver<()>, Sender<()>) {
        assert!(
            len.is_none_or(|l| !l.is_multiple_of(16384)),
            "node I/O could match"
        );
        let (held_tx, held_rx) = channel();
        let (go_tx, go_rx) = channel();
        *self.armed.lock().expect("gate") = Some((io, len, held_tx, go_rx));
        (held_rx, go_tx)
    }

    fn pass(&self, io: Io, len: usize) {
        let mut a = self.armed.lock().expect("gate");
        let hit = |x: &(Io, Option<usize>, _, _)| {
            x.0 == io && x.1.map_or(!len.is_multiple_of(16384), |l| l == len)
        };
        if a.as_ref().is_some_and(hit) {
            let (_, _, held, go) = a.take().expect("armed");
            drop(a);
            let _ = held.send(());
            let _ = go.recv();
        }
    }
}

impl BlockDevice for Gate {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.pass(Io::Read, buf.len());
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.pass(Io::Write, buf.len());
        self.inner.write_at(buf, off)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

fn gated_fs(bytes: u64, o: OpenOptions) -> (Arc<RecordingDevice>, Arc<Gate>, Arc<Fs>) {
    let base = Arc::new(MemDevice::new(bytes));
    Fs::mkfs(base.clone(), &MkfsOptions::default()).expect("mkfs");
    let rec = Arc::new(RecordingDevice::new(base.snapshot()));
    let gate = Arc::new(Gate {
        inner: rec.clone(),
        armed: Mutex::new(None),
    });
    let fs = Fs::open(gate.clone(), o).expect("open");
    (rec, gate, Arc::new(fs))
}

/// Closes the file system (every thread that held it done with it), then fsck of `dev`, with
/// the data, must be clean.
fn close_clean<D: BlockDevice + 'static>(fs: Arc<Fs>, dev: &Arc<D>) {
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("fs still shared"));
    fs.close().expect("close");
    assert_clean(dev);
}

/// Runs of whole blocks: (blocks, the byte they are filled with), one after the other.
fn blocks_of(runs: &[(usize, u8)]) -> Vec<u8> {
    runs.iter()
        .flat_map(|&(n, byte)| std::iter::repeat_n(byte, n * BS))
        .collect()
}

/// A new NOCOW file `name` in the root holding `len` bytes of 0xaa.
fn nocow_file(fs: &Fs, name: &[u8], len: usize) -> u64 {
    let n = fs.create(ROOT, name, 0o644, ME).expect("create").ino;
    fs.set_flags(n, NOCOW_FL).expect("chattr +C");
    fs.write(n, 0, &vec![0xaa; len]).expect("write");
    n
}

/// Waits for `rx` with a bound, so that a step that deadlocks fails instead of hanging.
fn within<T>(rx: &Receiver<T>, what: &str) -> T {
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: no progress in 20 s (waiting under the lock?)"))
}

/// A reader holds the mapping of blocks that an overwrite frees and other writes then fill the
/// device with: the blocks must not be handed out before the reader is done.
#[test]
fn blocks_freed_under_a_reader_are_not_reused_until_it_is_done() {
    let (_rec, gate, fs) = gated_fs(8 << 20, opts());
    // One block: the read is one device read of that length.
    let len = BS;
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &vec![0xaa; len]).expect("write");
    let (held, go) = gate.arm(Io::Read, Some(len));
    let (done_tx, done_rx) = channel();
    let reader = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let r = fs.read(f, 0, len);
            let _ = done_tx.send(());
            r
        })
    };
    within(&held, "the read reaching the device");
    // Same transaction: without readers, the overwritten blocks would be free at once.
    fs.write(f, 0, &vec![0xbb; len])
        .expect("overwrite beside the read");
    let g = fs.create(ROOT, b"g", 0o644, ME).expect("create").ino;
    let mut at = 0u64;
    while fs.write(g, at, &vec![0xcc; len]).is_ok() {
        at += len as u64;
    }
    let c = fs.counters().snapshot();
    let held_ranges = c
        .iter()
        .find(|(n, _)| *n == "blocks_held_for_readers")
        .map(|x| x.1);
    assert!(
        held_ranges.is_some_and(|n| n > 0),
        "nothing was held: {c:?}"
    );
    go.send(()).expect("go");
    within(&done_rx, "the read");
    let got = reader.join().expect("reader").expect("read");
    assert!(
        got.iter().all(|&b| b == 0xaa),
        "the read returned bytes that were never in its file"
    );
    // Once the reader left, its blocks come back: the device takes one more write.
    fs.write(g, at, &vec![0xcc; len])
        .expect("the held blocks are free again");
    assert_eq!(fs.read(f, 0, len).expect("read"), vec![0xbb; len]);
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("fs still shared"));
    fs.close().expect("close");
}

/// On a full device, a write that needs blocks held for a reader waits for the reader and
/// gets them, instead of failing with ENOSPC while they are about to be free.
/// A NOCOW file's overwrite of whole blocks goes to the device without the lock
/// (`in_place`): held there, it lets other operations run, among them a truncate that frees
/// its blocks and writes that fill the device; the freed blocks go to no other file until
/// it is done, so its late bytes land on no one else's data, and an fsync after it returned
/// finds them durable.
#[test]
fn a_nocow_overwrite_held_at_the_device_lands_on_no_other_files_blocks() {
    // No discard: a block freed in its own transaction is free at once (with discard it
    // would wait for the next commit whatever the fence says).
    let o = OpenOptions {
        discard: false,
        ..opts()
    };
    let (rec, gate, fs) = gated_fs(8 << 20, o.clone());
    // Five blocks: more than the last write into a full device leaves unused, so another
    // file's data gets some of them once they are free.
    let len = 5 * BS;
    let n = fs.create(ROOT, b"n", 0o644, ME).expect("create").ino;
    fs.set_flags(n, NOCOW_FL).expect("chattr +C");
    fs.write(n, 0, &vec![0xaa; len]).expect("write");
    // Its first device write (of one run of its blocks) is held.
    let (held, go) = gate.arm(Io::Write, None);
    let writer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(n, 0, &vec![0xbb; len]))
    };
    within(&held, "the overwrite reaching the device");
    // Beside it, in a thread of their own: were the overwrite under the lock, they would
    // wait for it (and `within` fail).
    let (done_tx, done_rx) = channel();
    let beside = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            // The file's blocks, written in this transaction, freed: free at once but for
            // the writer inside the fence.
            fs.truncate(n, 0).expect("truncate beside the overwrite");
            let g = fs.create(ROOT, b"g", 0o644, ME).expect("create").ino;
            let mut at = 0u64;
            while fs.write(g, at, &[0xcc; BS]).is_ok() {
                at += BS as u64;
            }
            let _ = done_tx.send(());
            (g, at)
        })
    };
    within(&done_rx, "operations beside the held overwrite");
    let (g, filled) = beside.join().expect("beside");
    go.send(()).expect("go");
    writer.join().expect("writer").expect("overwrite");
    // A block of g the overwrite reached fails its data sum (EIO), or reads its bytes.
    match fs.read(g, 0, filled as usize) {
        Ok(got) => assert!(
            got.iter().all(|&b| b == 0xcc),
            "another file's blocks got the late overwrite's bytes (first at {:?})",
            got.iter().position(|&b| b != 0xcc)
        ),
        Err(e) => panic!("another file's blocks got the late overwrite's bytes ({e})"),
    }
    // Once it is done, its blocks are free again for others.
    assert!(
        fs.write(g, filled, &[0xcc; BS]).is_ok(),
        "the blocks held for the overwrite were not given back"
    );
    // Durable at an fsync even though nothing but data changed: a NOCOW overwrite with
    // the times left alone (FUSE's writeback cache sets them itself).
    fs.unlink(ROOT, b"g").expect("unlink");
    fs.sync().expect("sync");
    fs.write(n, 0, &vec![0xdd; len]).expect("write");
    fs.sync().expect("sync");
    let how = idxfs_engine::fs::WriteHow {
        times: false,
        kill: Default::default(),
    };
    let before = fs.counters().overwrites_beside.get();
    fs.write_with(n, 0, &vec![0xee; len], how)
        .expect("overwrite");
    assert_eq!(fs.counters().overwrites_beside.get(), before + 1);
    fs.fsync(n).expect("fsync");
    let crashed = Arc::new(MemDevice::from_bytes(
        rec.crash_image(rec.event_count(), Tear::Drop(0)).bytes,
    ));
    let f = Fs::open(crashed, o).expect("open after the crash");
    assert!(
        f.read(n, 0, len).expect("read") == vec![0xee; len],
        "a NOCOW overwrite an fsync returned after is not durable"
    );
}

/// A NOCOW overwrite goes to the device without the lock (`in_place`). Operations under the
/// lock that copy part of its block elsewhere (a truncate into it, a hole punched in it) or
/// read it and write it back whole (a write of part of it that also fills a preallocated
/// block, which runs under the lock) must not run while it is in flight: the bytes they keep
/// would be the ones before it, and its own would be lost though it returned. Whichever
/// order the two take, its bytes are in the file afterwards.
#[test]
fn a_held_nocow_overwrite_is_not_lost_to_a_truncate_or_a_partial_write_beside_it() {
    let (_rec, gate, fs) = gated_fs(16 << 20, opts());
    let n = nocow_file(&fs, b"n", 4 * BS);
    let blocks = |k: usize| (k * BS) as u64;
    // Holds a whole-block overwrite of block 1 (0xbb) at the device while `beside` starts in a
    // thread of its own and gets 300 ms; then lets the overwrite go and waits for both.
    let held = |beside: Box<dyn FnOnce(&Fs) + Send>| {
        let (held, go) = gate.arm(Io::Write, Some(BS));
        let writer = {
            let fs = fs.clone();
            std::thread::spawn(move || fs.write(n, blocks(1), &vec![0xbb; BS]))
        };
        within(&held, "the held overwrite reaching the device");
        let (tx, rx) = channel();
        {
            let fs = fs.clone();
            std::thread::spawn(move || {
                beside(&fs);
                drop(fs);
                let _ = tx.send(());
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        go.send(()).expect("go");
        writer.join().expect("writer").expect("held overwrite");
        within(&rx, "the operation beside the overwrite");
    };
    held(Box::new(move |fs: &Fs| {
        fs.truncate(n, blocks(1) + 100)
            .expect("truncate into the held block");
    }));
    // The overwrite first and the truncate after, or the other way round (which grows the
    // file back to the overwrite's end): its bytes from block 1 to the end either way.
    let size = fs.getattr(n).expect("getattr").size;
    assert!(size == blocks(1) + 100 || size == blocks(2), "size {size}");
    let got = fs
        .read(n, blocks(1), (size - blocks(1)) as usize)
        .expect("read");
    assert!(
        got.iter().all(|&b| b == 0xbb),
        "the held overwrite's bytes were lost to the truncate (first other byte at {:?})",
        got.iter().position(|&b| b != 0xbb)
    );
    // A hole punched in the middle of the block copies the rest of it.
    fs.write(n, 0, &vec![0xaa; 4 * BS]).expect("write");
    held(Box::new(move |fs: &Fs| {
        let punch_keep_size = 0x02 | 0x01;
        fs.fallocate(n, blocks(1) + 100, 100, punch_keep_size)
            .expect("punch into the held block");
    }));
    let got = fs.read(n, blocks(1), BS).expect("read");
    let mut punched = vec![0xbb; BS];
    punched[100..200].fill(0);
    assert!(
        got == punched || got == vec![0xbb; BS],
        "the held overwrite's bytes were lost to a punch (first 0xaa at {:?})",
        got.iter().position(|&b| b == 0xaa)
    );
    // A write from the end of block 1 into block 2, preallocated: it fills block 2 whole,
    // so it runs under the lock, and reads block 1 to write it back whole. Held at that
    // write too, had it not waited, the overwrite lands between its read and its write.
    fs.write(n, 0, &vec![0xaa; 2 * BS]).expect("write");
    fs.truncate(n, blocks(2)).expect("truncate");
    fs.fallocate(n, blocks(2), blocks(2), 0).expect("fallocate");
    let (held1, go1) = gate.arm(Io::Write, Some(BS));
    let writer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(n, blocks(1), &vec![0xbb; BS]))
    };
    within(&held1, "the held overwrite reaching the device");
    let (held2, go2) = gate.arm(Io::Write, Some(BS));
    let partial = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(n, blocks(1) + 4000, &[0xcc; 200]))
    };
    let waited = held2.recv_timeout(Duration::from_millis(300)).is_err();
    go1.send(()).expect("go");
    writer.join().expect("writer").expect("held overwrite");
    if waited {
        within(&held2, "the partial write after the overwrite");
    }
    go2.send(()).expect("go");
    partial
        .join()
        .expect("partial")
        .expect("partial write into the held block");
    let got = fs.read(n, blocks(1), BS).expect("read");
    let mut after = vec![0xbb; BS];
    after[4000..].fill(0xcc);
    assert!(
        got == after || got == vec![0xbb; BS],
        "the held overwrite's bytes were lost to a partial write (first 0xaa at {:?})",
        got.iter().position(|&b| b == 0xaa)
    );
    let mut third = vec![0u8; BS];
    third[..104].fill(0xcc);
    assert!(fs.read(n, blocks(2), BS).expect("read") == third);
    close_clean(fs, &gate);
}

/// While an operation waits for a write in flight (`in_place`: a truncate into the block a
/// held NOCOW overwrite is writing), no other write leaves the lock: a stream of them into
/// that block could otherwise keep it in flight and the truncate waiting for ever. A write
/// then runs under the lock instead (into another block: it need not wait), and once the
/// held one is done the truncate runs.
#[test]
fn while_an_operation_waits_for_a_write_in_flight_no_other_leaves_the_lock() {
    let (_rec, gate, fs) = gated_fs(16 << 20, opts());
    let n = nocow_file(&fs, b"n", 4 * BS);
    let (held, go) = gate.arm(Io::Write, Some(BS));
    let writer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(n, BS as u64, &vec![0xbb; BS]))
    };
    within(&held, "the held overwrite reaching the device");
    let waits = fs.counters().in_flight_waits.get();
    let (tx, rx) = channel();
    let truncate = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let r = fs.truncate(n, BS as u64 + 100);
            drop(fs);
            let _ = tx.send(r);
        })
    };
    let (seen_tx, seen_rx) = channel();
    {
        let fs = fs.clone();
        std::thread::spawn(move || {
            while fs.counters().in_flight_waits.get() == waits {
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(fs);
            let _ = seen_tx.send(());
        });
    }
    within(&seen_rx, "the truncate meeting the write in flight");
    let beside = fs.counters().overwrites_beside.get();
    fs.write(n, 3 * BS as u64, &vec![0xcc; BS])
        .expect("an overwrite of another block while the truncate waits");
    assert_eq!(
        fs.counters().overwrites_beside.get(),
        beside,
        "a write left the lock while an operation waited for writes in flight"
    );
    go.send(()).expect("go");
    writer.join().expect("writer").expect("held overwrite");
    within(&rx, "the truncate after the write in flight").expect("truncate");
    truncate.join().expect("truncate");
    // The overwrite first, or the truncate first and the overwrite growing the file back.
    let size = fs.getattr(n).expect("getattr").size;
    let got = fs
        .read(n, BS as u64, (size - BS as u64) as usize)
        .expect("read");
    assert!(got.iter().all(|&b| b == 0xbb), "the held overwrite's bytes");
    close_clean(fs, &gate);
}

/// A NOCOW file's write of part of a written block goes to the device without the lock,
/// its own bytes only (`in_place`): held there, another such write into the same block runs
/// beside it, and both writes' bytes are in the block afterwards (neither reads the block
/// and writes it back).
#[test]
fn two_partial_nocow_overwrites_of_one_block_keep_each_others_bytes() {
    let (_rec, gate, fs) = gated_fs(16 << 20, opts());
    let n = nocow_file(&fs, b"n", 2 * BS);
    let before = fs.counters().overwrites_beside.get();
    let (held, go) = gate.arm(Io::Write, Some(100));
    let writer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(n, BS as u64 + 10, &[0xbb; 100]))
    };
    within(&held, "the held partial overwrite reaching the device");
    let (tx, rx) = channel();
    let beside = {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let _ = tx.send(fs.write(n, BS as u64 + 300, &[0xcc; 50]));
        })
    };
    within(
        &rx,
        "a partial overwrite of the same block beside the held one",
    )
    .expect("write");
    beside.join().expect("beside");
    go.send(()).expect("go");
    writer.join().expect("writer").expect("held write");
    assert_eq!(
        fs.counters().overwrites_beside.get(),
        before + 2,
        "both went to the device without the lock"
    );
    let mut want = vec![0xaa; 2 * BS];
    want[BS + 10..BS + 110].fill(0xbb);
    want[BS + 300..BS + 350].fill(0xcc);
    assert!(
        fs.read(n, 0, 2 * BS).expect("read") == want,
        "a partial overwrite lost the other's bytes"
    );
    close_clean(fs, &gate);
}

/// A NOCOW file's first write into preallocated blocks goes to the device without the lock
/// and converts them after (`in_place`). Held at the device, it lets other writes run: one
/// converting other blocks of the same extent (the held one still converts its own after),
/// one converting the held write's own blocks first, and a truncate and fallocate that give
/// its range other blocks. The last two make the held write run again under the lock, so
/// its bytes land where the file's blocks are then, and it is still the last write there.
#[test]
fn a_nocow_first_write_held_at_the_device_converts_after_or_runs_again() {
    let (_rec, gate, fs) = gated_fs(16 << 20, opts());
    let n = fs.create(ROOT, b"n", 0o644, ME).expect("create").ino;
    fs.set_flags(n, NOCOW_FL).expect("chattr +C");
    fs.fallocate(n, 0, 8 * BS as u64, 0).expect("fallocate");
    let blocks = |k: u64| k * BS as u64;
    let counters = |fs: &Fs| {
        let c = fs.counters();
        (c.overwrites_beside.get(), c.data_write_conflicts.get())
    };
    // Holds a write of two blocks at `at` at the device, runs `beside` in a thread of its own
    // (bounded: were the held write under the lock, it would wait), then lets it go on.
    let held_write = |at: u64, byte: u8, beside: Box<dyn FnOnce(&Fs) + Send>| {
        let (held, go) = gate.arm(Io::Write, None);
        let writer = {
            let fs = fs.clone();
            std::thread::spawn(move || fs.write(n, blocks(at), &vec![byte; 2 * BS]))
        };
        within(&held, "the held write reaching the device");
        let (done_tx, done_rx) = channel();
        let other = {
            let fs = fs.clone();
            std::thread::spawn(move || {
                beside(&fs);
                let _ = done_tx.send(());
            })
        };
        within(&done_rx, "writes beside the held one");
        other.join().expect("beside");
        go.send(()).expect("go");
        writer.join().expect("writer").expect("held write");
    };
    let (b0, c0) = counters(&fs);
    // Other blocks of the same extent: both convert their own.
    held_write(
        0,
        0xaa,
        Box::new(move |fs: &Fs| {
            fs.write(n, blocks(4), &vec![0xbb; 2 * BS])
                .expect("write beside");
        }),
    );
    assert_eq!(
        counters(&fs),
        (b0 + 2, c0),
        "two conversions outside the lock"
    );
    // The same blocks, converted first by the write beside: the held one runs again, last.
    held_write(
        2,
        0xcc,
        Box::new(move |fs: &Fs| {
            fs.write(n, blocks(2), &vec![0xdd; 2 * BS])
                .expect("write beside");
        }),
    );
    assert_eq!(
        counters(&fs).1,
        c0 + 1,
        "the held write ran again under the lock"
    );
    // Its blocks freed and the range preallocated again (other blocks, the held ones are
    // still busy): it runs again and fills the new ones.
    held_write(
        6,
        0xee,
        Box::new(move |fs: &Fs| {
            fs.truncate(n, blocks(6)).expect("truncate");
            fs.fallocate(n, blocks(6), blocks(2), 0).expect("fallocate");
        }),
    );
    assert_eq!(
        counters(&fs).1,
        c0 + 2,
        "the held write ran again under the lock"
    );
    let want = blocks_of(&[(2, 0xaa), (2, 0xcc), (2, 0xbb), (2, 0xee)]);
    assert!(
        fs.read(n, 0, 8 * BS).expect("read") == want,
        "the file's bytes after the held writes"
    );
    close_clean(fs, &gate);
}

/// A copy-on-write file's first write into its preallocated blocks fills them without the
/// lock and converts them, with the sums of its bytes, after (`in_place`). While it is held at
/// the device: a write into other blocks of the same extent goes on beside it; one into the
/// same blocks waits for its conversion (bytes of its own there would not match the held
/// write's sums), then runs, last; a truncate and a fallocate that give the range new blocks
/// make it run again into them. Every block then reads back with its sum, and fsck, with the
/// data, is clean.
#[test]
fn a_copy_on_write_first_write_held_at_the_device_keeps_other_writes_off_its_blocks() {
    let (_rec, gate, fs) = gated_fs(16 << 20, opts());
    let p = fs.create(ROOT, b"p", 0o644, ME).expect("create").ino;
    fs.fallocate(p, 0, 8 * BS as u64, 0).expect("fallocate");
    let blocks = |k: u64| k * BS as u64;
    let counters = |fs: &Fs| {
        let c = fs.counters();
        let n = (c.fills_beside.get(), c.in_flight_waits.get());
        (n.0, n.1, c.data_write_conflicts.get())
    };
    // Holds a write of two blocks at `at` at the device while `beside` runs; then lets it go.
    let held_write = |at: u64, byte: u8, beside: &dyn Fn(&Arc<Fs>)| {
        let (held, go) = gate.arm(Io::Write, None);
        let writer = {
            let fs = fs.clone();
            std::thread::spawn(move || fs.write(p, blocks(at), &vec![byte; 2 * BS]))
        };
        within(&held, "the held write reaching the device");
        beside(&fs);
        go.send(()).expect("go");
        writer.join().expect("writer").expect("held write");
    };
    let write_in_thread = |fs: &Arc<Fs>, at: u64, byte: u8| {
        let (tx, rx) = channel();
        let fs = fs.clone();
        std::thread::spawn(move || {
            let r = fs.write(p, blocks(at), &vec![byte; 2 * BS]);
            // Before the answer: the file system is closed once the last answer is in.
            drop(fs);
            let _ = tx.send(r);
        });
        rx
    };
    let (f0, w0, c0) = counters(&fs);
    held_write(0, 0xaa, &|fs| {
        let done = write_in_thread(fs, 4, 0xbb);
        within(&done, "a write into other blocks beside the held one").expect("write beside");
    });
    assert_eq!(
        counters(&fs),
        (f0 + 2, w0, c0),
        "both filled their blocks outside the lock"
    );
    // Into the blocks the held write is filling: it must not finish before the held one.
    let late = Mutex::new(None);
    held_write(2, 0xcc, &|fs| {
        let done = write_in_thread(fs, 2, 0xdd);
        std::thread::sleep(Duration::from_millis(200));
        if let Ok(r) = done.try_recv() {
            panic!("a write into blocks another was filling finished first: {r:?}");
        }
        *late.lock().expect("late") = Some(done);
    });
    let late = late.into_inner().expect("late").expect("the late write");
    within(&late, "the write that waited").expect("the write that waited");
    let (_, waits, conflicts) = counters(&fs);
    assert!(
        waits > w0,
        "the write did not wait for the held one's conversion"
    );
    assert_eq!(conflicts, c0, "the held write converted its own blocks");
    held_write(6, 0xee, &|fs| {
        fs.truncate(p, blocks(6)).expect("truncate");
        fs.fallocate(p, blocks(6), blocks(2), 0).expect("fallocate");
    });
    assert_eq!(
        counters(&fs).2,
        c0 + 1,
        "the held write ran again under the lock"
    );
    let want = blocks_of(&[(2, 0xaa), (2, 0xdd), (2, 0xbb), (2, 0xee)]);
    let got = fs
        .read(p, 0, 8 * BS)
        .expect("read (every block against its sum)");
    assert!(got == want, "the file's bytes after the held writes");
    close_clean(fs, &gate);
}

#[test]
fn a_write_that_needs_blocks_held_for_a_reader_waits_for_it() {
    // Large enough that an unlink fits in the global reserve (on a few MiB it does not).
    let (_rec, gate, fs) = gated_fs(256 << 20, opts());
    let len = 63 * BS;
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &vec![0xaa; len]).expect("write");
    let g = fs.create(ROOT, b"g", 0o644, ME).expect("create").ino;
    let mut at = 0u64;
    for piece in [64 * BS, BS] {
        while fs.write(g, at, &vec![0xcc; piece]).is_ok() {
            at += piece as u64;
        }
    }
    fs.sync().expect("sync");
    let (held, go) = gate.arm(Io::Read, None);
    let reader = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.read(f, 0, len))
    };
    within(&held, "the read reaching the device");
    // Nothing holds f but the reader's mapping: its blocks are held, not free.
    fs.unlink(ROOT, b"f").expect("unlink");
    fs.sync().expect("sync");
    let (done_tx, done_rx) = channel();
    {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let _ = done_tx.send(fs.write(g, at, &vec![0xdd; 16 * BS]));
        });
    }
    std::thread::sleep(Duration::from_millis(200));
    if let Ok(r) = done_rx.try_recv() {
        panic!("the write finished ({r:?}) while the only space it could have was held for the reader: {:?}", fs.statfs());
    }
    go.send(()).expect("go");
    within(&done_rx, "the write after the reader left").expect("write");
    let got = reader.join().expect("reader").expect("read");
    assert!(got.iter().all(|&b| b == 0xaa), "the reader saw other bytes");
    assert_eq!(fs.read(g, at, 16 * BS).expect("read"), vec![0xdd; 16 * BS]);
}

/// A commit frozen while a write is between claiming its blocks and linking them records those
/// blocks free: a crash then leaves no block used that nothing references.
#[test]
fn a_commit_beside_a_writes_device_io_records_its_blocks_free() {
    let (rec, gate, fs) = gated_fs(32 << 20, opts());
    let len = 5 * BS;
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.sync().expect("sync");
    let (held, go) = gate.arm(Io::Write, Some(len));
    let writer = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(f, 0, &vec![0xab; len]))
    };
    within(&held, "the write reaching the device");
    let (synced_tx, synced_rx) = channel();
    {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let _ = synced_tx.send(fs.sync());
        });
    }
    within(&synced_rx, "a commit beside the write").expect("sync");
    let crash = rec.crash_image(rec.event_count(), Tear::None);
    let dev = Arc::new(MemDevice::from_bytes(crash.bytes));
    assert_clean(&dev);
    go.send(()).expect("go");
    assert_eq!(writer.join().expect("writer").expect("write"), len);
    fs.sync().expect("sync");
    assert_eq!(fs.read(f, 0, len).expect("read"), vec![0xab; len]);
    let dev = Arc::new(MemDevice::from_bytes(
        rec.crash_image(rec.event_count(), Tear::None).bytes,
    ));
    assert_clean(&dev);
    let fs2 = Fs::open(dev, opts()).expect("open");
    assert_eq!(fs2.read(f, 0, len).expect("read"), vec![0xab; len]);
}

/// Two writes into one block, the first held at its device write while the second finishes:
/// the first must carry the second's bytes, not the ones it read before.
#[test]
fn two_writes_into_one_block_keep_each_others_bytes() {
    let (_rec, gate, fs) = gated_fs(32 << 20, opts());
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &vec![0x11; 2 * BS]).expect("write");
    let (held, go) = gate.arm(Io::Write, Some(BS));
    let first = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(f, 100, &[0xaa; 100]))
    };
    within(&held, "the first write reaching the device");
    let (done_tx, done_rx) = channel();
    {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let _ = done_tx.send(fs.write(f, 1000, &[0xbb; 100]));
        });
    }
    within(&done_rx, "a second write beside the first").expect("second write");
    go.send(()).expect("go");
    first.join().expect("first").expect("first write");
    let mut want = vec![0x11; 2 * BS];
    want[100..200].fill(0xaa);
    want[1000..1100].fill(0xbb);
    assert_eq!(fs.read(f, 0, 2 * BS).expect("read"), want);
    let c = fs.counters().snapshot();
    let conflicts = c
        .iter()
        .find(|(n, _)| *n == "data_write_conflicts")
        .map(|x| x.1);
    assert_eq!(
        conflicts,
        Some(1),
        "the first write ran again under the lock"
    );
}

/// A write that ends inside the file's last block, past the size, held at its device write
/// while another write lands further into that block: the first must not wipe the second's
/// bytes with the zeros it has past its end.
#[test]
fn a_write_into_the_last_block_keeps_a_later_write_past_it() {
    let (_rec, gate, fs) = gated_fs(32 << 20, opts());
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    fs.write(f, 0, &vec![0x11; BS + 4]).expect("write");
    let (held, go) = gate.arm(Io::Write, Some(BS));
    let first = {
        let fs = fs.clone();
        std::thread::spawn(move || fs.write(f, BS as u64, &[0xaa; 100]))
    };
    within(&held, "the first write reaching the device");
    let (done_tx, done_rx) = channel();
    {
        let fs = fs.clone();
        std::thread::spawn(move || {
            let _ = done_tx.send(fs.write(f, BS as u64 + 200, &[0xbb; 100]));
        });
    }
    within(&done_rx, "a second write beside the first").expect("second write");
    go.send(()).expect("go");
    first.join().expect("first").expect("first write");
    let mut want = vec![0x11; BS + 300];
    want[BS..BS + 100].fill(0xaa);
    want[BS + 100..BS + 200].fill(0);
    want[BS + 200..].fill(0xbb);
    assert_eq!(fs.read(f, 0, 2 * BS).expect("read"), want);
}

/// Delays data-sized I/O at random, so reads and writes outside the lock overlap other
/// operations far more than on a memory device.
struct Jitter {
    inner: MemDevice,
    seed: AtomicU64,
}

impl Jitter {
    /// Reads nap longer than writes: a reader outside the lock then sees many operations
    /// free and reallocate blocks while it reads.
    fn nap(&self, len: usize, read: bool) {
        if len.is_multiple_of(16384) {
            return;
        }
        let s = self
            .seed
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
        let x = (s ^ (s >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9) >> 58;
        if x < 24 {
            let unit = if read { 60 } else { 8 };
            std::thread::sleep(Duration::from_micros(x * unit));
        }
    }
}

impl BlockDevice for Jitter {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.nap(buf.len(), true);
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.nap(buf.len(), false);
        self.inner.write_at(buf, off)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

const SLOT: u64 = 64;
const WRITERS: u64 = 3;
const SHARED_LEN: u64 = 40_000;

/// Bytes writer `t` writes carry its tag in the top two bits (never 0): a byte of another
/// file, or of a block handed out again too early, shows up as the wrong tag.
fn tagged(t: u64, rng: &mut Rng) -> u8 {
    (t << 6) as u8 | (1 + rng.below(63)) as u8
}

/// Whether `t` owns byte `at` of a shared file: 64-byte slots dealt round robin, so most
/// blocks are shared by every writer and most writes leave bytes of others in their block.
fn owns(t: u64, at: u64) -> bool {
    (at / SLOT) % WRITERS == t
}

/// One writer: unaligned writes into its own slots of the shared files, reading back what
/// it owns (and checking every other byte carries its owner's tag or is zero), and writes,
/// truncates and reads of a file of its own against a model. Returns its models.
fn writer(
    fs: &Fs,
    t: u64,
    shared: &[u64],
    own: u64,
    seed: u64,
    steps: u64,
) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut rng = Rng::new(seed ^ (t + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut models = vec![vec![0u8; SHARED_LEN as usize]; shared.len()];
    let mut mine: Vec<u8> = Vec::new();
    // The writer's next slot in the first shared file: the writers fill it front to back,
    // side by side, so most of their writes there land past its size, in its last block.
    let mut next = 0;
    for step in 0..steps {
        let ctx = format!("seed {seed} writer {t} step {step}");
        match rng.below(10) {
            0..=4 => {
                let i = rng.below(shared.len() as u64) as usize;
                let slots = SHARED_LEN / SLOT / WRITERS;
                let (a, b) = if i == 0 && next < slots {
                    // Whole slots: one in 64 starts a block, ending in it past the size.
                    next += 1;
                    let slot = (next - 1) * WRITERS + t;
                    (slot * SLOT, slot * SLOT + SLOT)
                } else {
                    let slot = rng.below(slots) * WRITERS + t;
                    let a = slot * SLOT + rng.below(SLOT);
                    (a, a + 1 + rng.below(slot * SLOT + SLOT - a))
                };
                if i == 1 && rng.below(6) == 0 {
                    // A hole punched in its own bytes of the NOCOW file: the rest of each
                    // block it cuts into is copied, so it waits for the other writers'
                    // writes in flight there (`in_place`), whose bytes it must keep.
                    let punch_keep_size = 0x02 | 0x01;
                    fs.fallocate(shared[i], a, b - a, punch_keep_size)
                        .unwrap_or_else(|e| panic!("{ctx}: punch {e:?} ({:?})", fs.failure()));
                    models[i][a as usize..b as usize].fill(0);
                    continue;
                }
                let bytes: Vec<u8> = (a..b).map(|_| tagged(t, &mut rng)).collect();
                fs.write(shared[i], a, &bytes)
                    .unwrap_or_else(|e| panic!("{ctx}: {e:?} ({:?})", fs.failure()));
                models[i][a as usize..b as usize].copy_from_slice(&bytes);
            }
            5 => {
                let i = rng.below(shared.len() as u64) as usize;
                let got = fs
                    .read(shared[i], 0, SHARED_LEN as usize)
                    .unwrap_or_else(|e| panic!("{ctx}: {e:?} ({:?})", fs.failure()));
                for at in 0..SHARED_LEN {
                    // Past the size reads as zeros.
                    let byte = got.get(at as usize).copied().unwrap_or(0);
                    if owns(t, at) {
                        assert_eq!(
                            byte, models[i][at as usize],
                            "{ctx}: own byte {at} of shared {i}"
                        );
                    } else {
                        assert!(
                            byte == 0 || (byte >> 6) as u64 == (at / SLOT) % WRITERS,
                            "{ctx}: byte {at} of shared {i} is {byte:#x}, not its owner's"
                        );
                    }
                }
            }
            6 | 7 => {
                // Half of them whole blocks: writer 0's file is NOCOW, and those of its
                // writes that overwrite written blocks go to the device without the lock.
                let (off, len) = if rng.below(2) == 0 {
                    (rng.below(6) * BS as u64, (1 + rng.below(2)) * BS as u64)
                } else {
                    let len = [1, 300, BS as u64, 3 * BS as u64 + 7][rng.below(4) as usize];
                    (rng.below(6 * BS as u64), len)
                };
                let bytes: Vec<u8> = (0..len).map(|_| tagged(3, &mut rng)).collect();
                fs.write(own, off, &bytes)
                    .unwrap_or_else(|e| panic!("{ctx}: {e:?} ({:?})", fs.failure()));
                let end = (off + len) as usize;
                if mine.len() < end {
                    mine.resize(end, 0);
                }
                mine[off as usize..end].copy_from_slice(&bytes);
            }
            8 => {
                let size = rng.below(7 * BS as u64) as usize;
                fs.truncate(own, size as u64)
                    .unwrap_or_else(|e| panic!("{ctx}: {e:?} ({:?})", fs.failure()));
                mine.resize(size, 0);
                // Writer 0's NOCOW file and writer 1's copy-on-write one: half the time
                // preallocated again past the cut, so their whole-block writes there fill
                // preallocated blocks outside the lock (writer 1's with their sums).
                if t < 2 && rng.below(2) == 0 {
                    let end = 7 * BS as u64;
                    fs.fallocate(own, size as u64, end - size as u64, 0)
                        .unwrap_or_else(|e| panic!("{ctx}: {e:?} ({:?})", fs.failure()));
                    mine.resize(end as usize, 0);
                }
            }
            _ => {
                let got = if rng.below(2) == 0 {
                    fs.read(own, 0, 16 * BS)
                        .unwrap_or_else(|e| panic!("{ctx}: {e:?} ({:?})", fs.failure()))
                } else {
                    // Into a buffer of other bytes, as a FUSE reply's: every byte read is
                    // written, none past them.
                    let mut buf = vec![0xa5u8; 16 * BS + 13];
                    let n = fs
                        .read_into(own, 0, &mut buf)
                        .unwrap_or_else(|e| panic!("{ctx}: {e:?} ({:?})", fs.failure()));
                    assert!(
                        buf[n..].iter().all(|&b| b == 0xa5),
                        "{ctx}: read_into wrote past its {n} bytes"
                    );
                    buf.truncate(n);
                    buf
                };
                assert!(got == mine, "{ctx}: own file differs from its model");
                if rng.below(4) == 0 {
                    fs.fsync(own)
                        .unwrap_or_else(|e| panic!("{ctx}: {e:?} ({:?})", fs.failure()));
                }
            }
        }
    }
    (models, mine)
}

/// Two writers extend one file block by block in step, one at the start of each new block and
/// one further into it, on a device that delays data I/O: every round, both writes' bytes are
/// there (a write past the size that reads nothing must still notice the other).
#[test]
fn writers_extending_one_block_side_by_side_keep_both() {
    let (mut rng, seed) = Rng::from_env("data_io_extend");
    let dev = Arc::new(Jitter {
        inner: MemDevice::new(64 << 20),
        seed: AtomicU64::new(rng.next_u64()),
    });
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    // Past the inline limit, so every write below goes to blocks.
    fs.write(f, 0, &vec![0x11; BS]).expect("write");
    const ROUNDS: u64 = 400;
    let step = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for (at, byte) in [(0u64, 0xaau8), (200, 0xbb)] {
            let (fs, step) = (&fs, &step);
            s.spawn(move || {
                for k in 1..=ROUNDS {
                    step.wait();
                    fs.write(f, k * BS as u64 + at, &[byte; 100])
                        .expect("write");
                }
            });
        }
    });
    let got = fs.read(f, 0, (ROUNDS as usize + 1) * BS).expect("read");
    for k in 1..=ROUNDS as usize {
        let b = &got[k * BS..(k * BS + 300).min(got.len())];
        assert!(
            b[..100].iter().all(|&x| x == 0xaa)
                && b[100..200].iter().all(|&x| x == 0)
                && b[200..].iter().all(|&x| x == 0xbb),
            "seed {seed}: block {k} lost a write"
        );
    }
    fs.close().expect("close");
    assert_clean(&dev);
}

/// Writers share blocks of two files and each has a file of its own, on a device that delays
/// data I/O, with commits every few milliseconds: every read matches the models, and so does
/// the image after a remount, which fsck finds clean.
#[test]
fn concurrent_reads_and_writes_match_their_models() {
    let (mut rng, seed) = Rng::from_env("data_io");
    let steps = std::env::var("IDXFS_DATA_IO_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let mem = MemDevice::new(16 << 20);
    let dev = Arc::new(Jitter {
        inner: mem,
        seed: AtomicU64::new(rng.next_u64()),
    });
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let o = OpenOptions {
        commit_interval: Some(Duration::from_millis(3)),
        ..opts()
    };
    let fs = Arc::new(Fs::open(dev.clone(), o).expect("open"));
    // A nearly full device: the allocator wraps around every few hundred blocks, so blocks
    // freed a moment ago are what it hands out next.
    let mut ballast = Vec::new();
    'fill: loop {
        let name = format!("ballast{}", ballast.len());
        let Ok(b) = fs.create(ROOT, name.as_bytes(), 0o644, ME) else {
            break;
        };
        ballast.push(name);
        for at in 0..4 {
            if fs.write(b.ino, at << 16, &[0x77; 1 << 16]).is_err() {
                break 'fill;
            }
        }
    }
    // Room for the writers: 3 MiB (the global reserve a delete needs is about 2.3 MiB of
    // this 16 MiB device since data sums came, and the writers' copies wait for commits).
    for name in ballast.iter().rev().take(12) {
        fs.unlink(ROOT, name.as_bytes()).expect("unlink");
    }
    fs.sync().expect("sync");
    eprintln!("statfs {:?}", fs.statfs());
    fs.sync().expect("sync");
    let shared: Vec<u64> = (0..2)
        .map(|i| {
            // Empty: the writers grow them, each write past the size moving it.
            fs.create(ROOT, format!("s{i}").as_bytes(), 0o644, ME)
                .expect("create")
                .ino
        })
        .collect();
    let own: Vec<u64> = (0..WRITERS)
        .map(|t| {
            fs.create(ROOT, format!("own{t}").as_bytes(), 0o644, ME)
                .expect("create")
                .ino
        })
        .collect();
    fs.set_flags(own[0], NOCOW_FL).expect("chattr +C");
    // The second shared file NOCOW: the writers' writes into its written blocks put only
    // their own bytes on the device, without the lock, beside each other's and beside the
    // writes past its size, which run under the lock and read the last block whole.
    fs.set_flags(shared[1], NOCOW_FL).expect("chattr +C");
    let threads: Vec<_> = (0..WRITERS)
        .map(|t| {
            let (fs, shared, own) = (fs.clone(), shared.clone(), own[t as usize]);
            std::thread::spawn(move || writer(&fs, t, &shared, own, seed, steps))
        })
        .collect();
    let results: Vec<_> = threads
        .into_iter()
        .map(|h| h.join().expect("writer panicked"))
        .collect();
    // Each shared byte is what its owner last wrote.
    let mut want = vec![vec![0u8; SHARED_LEN as usize]; shared.len()];
    for (t, (models, _)) in results.iter().enumerate() {
        for (i, m) in models.iter().enumerate() {
            for at in 0..SHARED_LEN {
                if owns(t as u64, at) {
                    want[i][at as usize] = m[at as usize];
                }
            }
        }
    }
    let check = |fs: &Fs, when: &str| {
        for (i, &f) in shared.iter().enumerate() {
            let got = fs.read(f, 0, SHARED_LEN as usize).expect("read");
            // The size is the end of the furthest write, at or past the last byte that is
            // not zero (written bytes never are; a hole punched at the end keeps the size).
            let size = want[i].iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
            assert!(
                got.len() >= size && got == want[i][..got.len()],
                "seed {seed} {when}: shared file {i} differs"
            );
        }
        for (t, (_, mine)) in results.iter().enumerate() {
            let got = fs.read(own[t], 0, 16 * BS).expect("read");
            assert!(
                &got == mine,
                "seed {seed} {when}: file of writer {t} differs"
            );
        }
    };
    check(&fs, "before the remount");
    let c = fs.counters().snapshot();
    eprintln!(
        "seed {seed}: {:?}",
        c.iter()
            .filter(|(n, _)| {
                n.starts_with("data_")
                    || [
                        "blocks_held_for_readers",
                        "overwrites_beside",
                        "fills_beside",
                        "in_flight_waits",
                    ]
                    .contains(n)
            })
            .collect::<Vec<_>>()
    );
    assert!(
        fs.counters().overwrites_beside.get() > 0,
        "seed {seed}: no NOCOW overwrite went to the device without the lock"
    );
    assert!(
        fs.counters().fills_beside.get() > 0,
        "seed {seed}: no copy-on-write fill of preallocated blocks went to the device \
         without the lock"
    );
    close_clean(fs, &dev);
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    check(&fs, "after the remount");
}

/// `read_into` writes exactly the bytes `read` returns, over whatever the buffer held: inline
/// bytes, holes, preallocated blocks and written ones, at every kind of edge.
#[test]
fn read_into_writes_what_read_returns_and_nothing_past() {
    let dev = Arc::new(MemDevice::new(16 << 20));
    Fs::mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let fs = Fs::open(dev.clone(), opts()).expect("open");
    let mut rng = Rng::new(0x005e_ed0f_2ead);
    let inline = fs.create(ROOT, b"inline", 0o644, ME).expect("create").ino;
    fs.write(inline, 0, b"short and inline").expect("write");
    let mixed = fs.create(ROOT, b"mixed", 0o644, ME).expect("create").ino;
    let bytes: Vec<u8> = (0..3 * BS + 100).map(|i| (i % 251) as u8 + 1).collect();
    fs.write(mixed, BS as u64 + 17, &bytes)
        .expect("write after a hole");
    fs.fallocate(mixed, 6 * BS as u64, 3 * BS as u64, 0)
        .expect("preallocate past the data");
    fs.truncate(mixed, 12 * BS as u64 + 5)
        .expect("a hole at the end");
    for f in [inline, mixed] {
        let size = fs.getattr(f).expect("getattr").size;
        for _ in 0..300 {
            let off = rng.below(size + 2 * BS as u64);
            let len = rng.below(5 * BS as u64) as usize;
            let want = fs.read(f, off, len).expect("read");
            let mut buf = vec![0xeeu8; len + 9];
            let n = fs.read_into(f, off, &mut buf[..len]).expect("read_into");
            assert_eq!(n, want.len(), "file {f} at {off} for {len}");
            assert_eq!(&buf[..n], &want[..], "file {f} at {off} for {len}");
            assert!(
                buf[n..].iter().all(|&b| b == 0xee),
                "file {f} at {off} for {len}: bytes past the read changed"
            );
        }
    }
    fs.close().expect("close");
    assert_clean(&dev);
}
