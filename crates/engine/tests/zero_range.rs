//! fallocate's ZERO_RANGE against a model: random writes, truncates, preallocations, punches
//! and zero ranges (with and without keep-size) over one file on a small device, every read
//! compared with a byte vector, the allocation a zero range promises checked, commits and
//! remounts between, fsck clean at the end. `IDXFS_SEED=n` replays a run.
mod common;
use common::*;
use idxfs_engine::fs::{Fs, FALLOC_KEEP_SIZE, FALLOC_PUNCH_HOLE, FALLOC_ZERO_RANGE};
use idxfs_engine::testutil::Rng;
use idxfs_engine::Error;

const BS: u64 = 4096;
/// Offsets stay below this: a few hundred blocks, so ranges overlap often.
const SPAN: u64 = 1 << 20;

fn check(fs: &Fs, ino: u64, model: &[u8], what: &str) {
    let a = fs.getattr(ino).expect("getattr");
    assert_eq!(a.size, model.len() as u64, "size after {what}");
    let got = fs.read(ino, 0, model.len() + 8192).expect("read");
    if got != model {
        let at = got.iter().zip(model).position(|(a, b)| a != b);
        panic!(
            "bytes differ after {what}: first at {at:?}, lengths {} {}",
            got.len(),
            model.len()
        );
    }
}

#[test]
fn zero_range_matches_a_model() {
    let (mut rng, seed) = Rng::from_env("zero_range");
    eprintln!("IDXFS_SEED={seed}");
    let (dev, fs) = mem_fs(32 << 20);
    let mut fs = Some(fs);
    let ino = fs
        .as_ref()
        .expect("open")
        .create(ROOT, b"f", 0o644, ME)
        .expect("create")
        .ino;
    let mut model: Vec<u8> = Vec::new();
    let mut zeroed = 0;
    for step in 0..4000 {
        let f = fs.as_ref().expect("open");
        let off = rng.below(SPAN);
        let len = match rng.below(4) {
            0 => 1 + rng.below(64),
            1 => 1 + rng.below(BS * 2),
            _ => 1 + rng.below(BS * 40),
        };
        let end = (off + len) as usize;
        let what = match rng.below(10) {
            0..=2 => {
                let data = rng.bytes(len as usize);
                f.write(ino, off, &data).expect("write");
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
                "write"
            }
            3 => {
                let size = rng.below(SPAN);
                f.truncate(ino, size).expect("truncate");
                model.resize(size as usize, 0);
                "truncate"
            }
            4 => {
                f.fallocate(ino, off, len, FALLOC_PUNCH_HOLE | FALLOC_KEEP_SIZE)
                    .expect("punch");
                let e = end.min(model.len());
                if (off as usize) < e {
                    model[off as usize..e].fill(0);
                }
                "punch"
            }
            5 => {
                f.fallocate(ino, off, len, 0).expect("preallocate");
                if model.len() < end {
                    model.resize(end, 0);
                }
                "preallocate"
            }
            _ => {
                let keep = rng.chance(30);
                let mode = FALLOC_ZERO_RANGE | if keep { FALLOC_KEEP_SIZE } else { 0 };
                let before = f.getattr(ino).expect("getattr").blocks;
                let a = f.fallocate(ino, off, len, mode).expect("zero range");
                let e = if keep { end.min(model.len()) } else { end };
                if model.len() < e {
                    model.resize(e, 0);
                }
                if (off as usize) < e {
                    model[off as usize..e].fill(0);
                }
                // The range owns its blocks: at least the whole blocks inside it, whatever
                // was there before.
                let whole = ((off + len) / BS).saturating_sub(off.div_ceil(BS));
                assert!(
                    a.blocks * 512 >= whole * BS,
                    "step {step}: {} bytes allocated after zeroing {off}+{len} (had {})",
                    a.blocks * 512,
                    before * 512
                );
                zeroed += 1;
                if keep {
                    "zero range, keep size"
                } else {
                    "zero range"
                }
            }
        };
        check(f, ino, &model, &format!("step {step}: {what} {off}+{len}"));
        if rng.chance(3) {
            f.sync().expect("sync");
        }
        if rng.chance(1) {
            fs.take().expect("open").close().expect("close");
            fs = Some(Fs::open(dev.clone(), opts()).expect("reopen"));
            check(
                fs.as_ref().expect("open"),
                ino,
                &model,
                &format!("step {step}: reopen"),
            );
        }
    }
    assert!(zeroed > 300, "the mix zeroes ranges ({zeroed})");
    fs.take().expect("open").close().expect("close");
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    check(&fs, ino, &model, "the last reopen");
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn zero_range_refuses_what_does_not_fit_before_changing_anything() {
    let (dev, fs) = mem_fs(16 << 20);
    let f = fs.create(ROOT, b"f", 0o644, ME).expect("create").ino;
    let data = vec![7u8; 4 << 20];
    fs.write(f, 0, &data).expect("write");
    fs.sync().expect("sync");
    // Zeroing all 4 MiB needs 4 MiB of new blocks beside the committed ones: fill the rest.
    let g = fs.create(ROOT, b"g", 0o644, ME).expect("create").ino;
    let mut at = 0;
    while fs.write(g, at, &[1u8; 1 << 16]).is_ok() {
        at += 1 << 16;
    }
    let r = fs.fallocate(f, 100, (4 << 20) - 200, FALLOC_ZERO_RANGE);
    assert!(matches!(r, Err(Error::NoSpace)), "{r:?}");
    assert_eq!(
        fs.read(f, 0, 4 << 20).expect("read"),
        data,
        "nothing changed"
    );
    // Deleting the filler makes room, and the same call then works.
    fs.unlink(ROOT, b"g").expect("unlink");
    fs.sync().expect("sync");
    fs.fallocate(f, 100, (4 << 20) - 200, FALLOC_ZERO_RANGE)
        .expect("zero range");
    let mut want = data.clone();
    want[100..(4 << 20) - 100].fill(0);
    assert_eq!(fs.read(f, 0, 4 << 20).expect("read"), want);
    fs.close().expect("close");
    assert_clean(&dev);
}
