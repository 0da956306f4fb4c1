//! A digest of everything a user can observe in a file system: names, types, modes, sizes,
//! link counts, contents, symlink targets, xattrs. Two states are equal iff their digests are.
use idxfs_engine::fs::NOCOW_FL;
use idxfs_engine::Fs;

pub fn digest(fs: &Fs) -> String {
    let mut out = String::new();
    walk(fs, 1, "", &mut out, false);
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
