//! `Fs::create_file` (a file made whole in one operation, for `idxfs mkfs --from`) against
//! its reference, the three operations it stands for: `create`, `write` and `setattr` of the
//! times. Every attribute but the inode number, and every byte, read the same, before and
//! after a reopen, with fsck clean (data sums verified); and it refuses what `create` would,
//! before any change.
mod common;
use common::*;
use idxfs_engine::fs::{Attr, NewFile, Owner, SetAttr, SetTime, Time, NEW_FILE_MAX};
use idxfs_engine::{Error, Fs};

/// The attributes a copy must reproduce (all but the inode number and btime, which is the
/// time the inode was made).
fn seen(a: &Attr) -> String {
    let t = |t: Time| (t.sec, t.nsec);
    format!(
        "size {} blocks {} mode {:o} nlink {} uid {} gid {} times {:?}",
        a.size,
        a.blocks,
        a.mode,
        a.nlink,
        a.uid,
        a.gid,
        [t(a.atime), t(a.mtime), t(a.ctime)]
    )
}

fn bytes(n: usize, salt: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 131 + salt + i / 4096) as u8).collect()
}

/// A file of mode 0644, owned by `ME`, with every time at 1970, holding `data`.
fn plain(data: &[u8]) -> NewFile<'_> {
    let t = Time { sec: 0, nsec: 0 };
    NewFile {
        mode: 0o644,
        owner: ME,
        atime: t,
        mtime: t,
        ctime: t,
        data,
    }
}

/// Makes `name` in `dir` the three-operation way.
fn by_hand(fs: &Fs, dir: u64, name: &[u8], f: &NewFile) -> Attr {
    let a = fs.create(dir, name, f.mode, f.owner).expect("create");
    if !f.data.is_empty() {
        fs.write(a.ino, 0, f.data).expect("write");
    }
    let set = SetAttr {
        atime: Some(SetTime::At(f.atime)),
        mtime: Some(SetTime::At(f.mtime)),
        ctime: Some(f.ctime),
        ..SetAttr::default()
    };
    fs.setattr(a.ino, &set).expect("setattr")
}

#[test]
fn a_file_made_whole_reads_as_create_write_and_setattr_made_it() {
    let (dev, fs) = mem_fs(256 << 20);
    let whole = fs.mkdir(ROOT, b"whole", 0o755, ME).expect("mkdir").ino;
    let hand = fs.mkdir(ROOT, b"hand", 0o755, ME).expect("mkdir").ino;
    // Empty, inline, around a block, several extents' worth, the most it takes.
    let sizes = [
        0usize,
        1,
        100,
        2000,
        4095,
        4096,
        4097,
        65_537,
        300_000,
        NEW_FILE_MAX,
    ];
    let mut pairs = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let data = bytes(n, i);
        let f = NewFile {
            mode: [0o644, 0o4755, 0o2640, 0o000][i % 4],
            owner: Owner {
                uid: 1000 + i as u32,
                gid: 2000 + i as u32,
            },
            atime: Time {
                sec: -1_000_000 + i as i64,
                nsec: 999_999_999,
            },
            mtime: Time {
                sec: 4_102_444_800 + i as i64,
                nsec: i as u32,
            },
            ctime: Time {
                sec: 1_600_000_000,
                nsec: 5,
            },
            data: &data,
        };
        let name = format!("f{n}");
        let a = fs
            .create_file(whole, name.as_bytes(), &f)
            .expect("create_file");
        let b = by_hand(&fs, hand, name.as_bytes(), &f);
        assert_eq!(seen(&a), seen(&b), "{name}: what create_file returns");
        pairs.push((a.ino, b.ino, data));
    }
    let compare = |fs: &Fs| {
        for (a, b, data) in &pairs {
            let (x, y) = (fs.getattr(*a).expect("attr"), fs.getattr(*b).expect("attr"));
            assert_eq!(seen(&x), seen(&y), "inodes {a} and {b}");
            assert_eq!(x.size, data.len() as u64);
            let got = fs.read(*a, 0, data.len() + 10).expect("read");
            assert!(got == *data, "inode {a}: its bytes");
        }
    };
    compare(&fs);
    fs.close().expect("close");
    assert_clean(&dev);
    let fs = Fs::open(dev.clone(), opts()).expect("reopen");
    compare(&fs);
    fs.close().expect("close");
}

#[test]
fn a_set_group_id_directory_passes_its_group_on_as_to_create() {
    let (dev, fs) = mem_fs(64 << 20);
    let d = fs.mkdir(ROOT, b"shared", 0o2775, ME).expect("mkdir").ino;
    let f = NewFile {
        mode: 0o640,
        owner: Owner { uid: 7, gid: 8 },
        atime: Time { sec: 1, nsec: 0 },
        mtime: Time { sec: 2, nsec: 0 },
        ctime: Time { sec: 3, nsec: 0 },
        data: b"x",
    };
    let a = fs.create_file(d, b"a", &f).expect("create_file");
    let b = by_hand(&fs, d, b"b", &f);
    assert_eq!(a.gid, ME.gid, "the directory's group");
    assert_eq!(seen(&a), seen(&b));
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn what_create_file_refuses_it_refuses_before_any_change() {
    let (dev, fs) = mem_fs(64 << 20);
    fs.create_file(ROOT, b"there", &plain(b"first"))
        .expect("create_file");
    let before = digest::digest(&fs);
    let r = fs.create_file(ROOT, b"there", &plain(b"second"));
    assert!(matches!(r, Err(Error::Exists)), "{r:?}");
    let r = fs.create_file(ROOT, &[b'n'; 256], &plain(b""));
    assert!(matches!(r, Err(Error::NameTooLong)), "{r:?}");
    let big = vec![0u8; NEW_FILE_MAX + 1];
    let r = fs.create_file(
        ROOT,
        b"big",
        &NewFile {
            data: &big,
            ..plain(b"")
        },
    );
    assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
    let bad = NewFile {
        mtime: Time {
            sec: 0,
            nsec: 1_000_000_000,
        },
        ..plain(b"")
    };
    let r = fs.create_file(ROOT, b"bad", &bad);
    assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
    assert_eq!(digest::digest(&fs), before, "nothing changed");
    fs.close().expect("close");
    assert_clean(&dev);
}

#[test]
fn a_full_device_refuses_the_file_whole_and_stays_writable() {
    let (dev, fs) = mem_fs(32 << 20);
    let data = vec![0x5au8; NEW_FILE_MAX];
    let f = plain(&data);
    let mut made = 0;
    let refused = loop {
        match fs.create_file(ROOT, format!("f{made}").as_bytes(), &f) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 100, "a 32 MiB image took 100 MiB");
    };
    assert!(matches!(refused, Error::NoSpace), "{refused:?}");
    assert!(
        matches!(
            fs.lookup(ROOT, format!("f{made}").as_bytes()),
            Err(Error::NotFound)
        ),
        "a refused file leaves no name"
    );
    // Still writable: the last file goes, and the refused one fits.
    fs.unlink(ROOT, format!("f{}", made - 1).as_bytes())
        .expect("unlink");
    fs.sync().expect("sync");
    fs.create_file(ROOT, format!("f{made}").as_bytes(), &f)
        .expect("room again");
    fs.close().expect("close");
    assert_clean(&dev);
}
