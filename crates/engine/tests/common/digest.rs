//! A digest of everything a user can observe in a file system: names, types, modes, sizes,
//! link counts, contents, symlink targets, xattrs. Two states are equal iff their digests are.
use idxfs_engine::fs::NOCOW_FL;
use idxfs_engine::Fs;

pub fn digest(fs: &Fs) -> String {
    let mut out = String::new();
    walk(fs, 1, "", &mut out, false);
    out
}

/// `digest` of what is under directory `dir` alone.
pub fn digest_at(fs: &Fs, dir: u64) -> String {
    let mut out = String::new();
    walk(fs, dir, "", &mut out, false);
    out
}

/// `digest` without the bytes of NOCOW files: what a crash leaves of a committed state, in
/// which a NOCOW file's blocks hold whatever in-place writes after the commit reached the
/// device (old or new bytes per block, as btrfs's nodatacow).
pub fn digest_crash_stable(fs: &Fs) -> String {
    let mut out = String::new();
    walk(fs, 1, "", &mut out, true);
    out
}

fn walk(fs: &Fs, dir: u64, path: &str, out: &mut String, skip_nocow: bool) {
    let mut es = fs.list(dir).expect("list");
    es.sort_by(|a, b| a.name.cmp(&b.name));
    // readdirplus (which may answer from what was published without the lock) lists the
    // same names, with the attributes getattr gives.
    let mut plus = fs
        .readdir_plus_batch(dir, 0, usize::MAX)
        .expect("readdirplus")
        .entries;
    plus.retain(|(e, _)| e.name != b"." && e.name != b"..");
    plus.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    let listed: Vec<(&[u8], u64)> = es.iter().map(|e| (&e.name[..], e.ino)).collect();
    assert_eq!(
        plus.iter()
            .map(|(e, _)| (&e.name[..], e.ino))
            .collect::<Vec<_>>(),
        listed,
        "{path}/: readdirplus and readdir list different names"
    );
    for (e, a) in &plus {
        let g = fs.getattr(e.ino).expect("getattr");
        assert_eq!(
            (a.mode, a.nlink, a.size, a.uid, a.gid),
            (g.mode, g.nlink, g.size, g.uid, g.gid),
            "{path}/{}: readdirplus's attributes and getattr's",
            String::from_utf8_lossy(&e.name)
        );
    }
    for e in es {
        let p = format!("{path}/{}", String::from_utf8_lossy(&e.name));
        let a = fs.getattr(e.ino).expect("getattr");
        out.push_str(&format!(
            "{p} mode={:o} nlink={} size={}",
            a.mode, a.nlink, a.size
        ));
        let mut xs = fs.listxattr(e.ino).expect("listxattr");
        xs.sort();
        for x in xs {
            let v = fs.getxattr(e.ino, &x).expect("getxattr");
            out.push_str(&format!(" x:{}={}", String::from_utf8_lossy(&x), v.len()));
        }
        match a.mode & 0o170000 {
            0o040000 => {
                out.push('\n');
                walk(fs, e.ino, &p, out, skip_nocow);
            }
            0o100000 if skip_nocow && fs.flags(e.ino).expect("flags") & NOCOW_FL != 0 => {
                out.push_str(" nocow\n");
            }
            0o100000 => {
                let data = fs.read(e.ino, 0, a.size as usize).expect("read");
                let h = data.iter().fold(0xcbf29ce484222325u64, |h, b| {
                    (h ^ *b as u64).wrapping_mul(0x100000001b3)
                });
                out.push_str(&format!(" data={h:x}\n"));
            }
            0o120000 => out.push_str(&format!(
                " -> {}\n",
                String::from_utf8_lossy(&fs.readlink(e.ino).expect("readlink"))
            )),
            _ => out.push('\n'),
        }
    }
}
