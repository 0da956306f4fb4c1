//! docs/format.md agrees with the code: every row of its checked tables matches the constant of
//! the same name, and every constant listed here appears in the document.
use idxfs_format::*;

fn doc() -> String {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/format.md");
    std::fs::read_to_string(p).expect("docs/format.md exists")
}

/// Rows `| `NAME` | VALUE | ...` of the document.
fn rows(doc: &str) -> Vec<(String, String)> {
    doc.lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((name.to_string(), cells.get(2)?.to_string()))
        })
        .collect()
}

#[test]
fn constants_sizes_and_item_types_match() {
    let mut expect: Vec<(&str, String)> = vec![
        ("BLOCK_SIZE", BLOCK_SIZE.to_string()),
        ("DEFAULT_NODE_SIZE", DEFAULT_NODE_SIZE.to_string()),
        ("MIN_NODE_SIZE", MIN_NODE_SIZE.to_string()),
        ("MAX_NODE_SIZE", MAX_NODE_SIZE.to_string()),
        ("SUPER_COPIES", SUPER_COPIES.to_string()),
        ("TREE_FS", TREE_FS.to_string()),
        ("TREE_SPACE", TREE_SPACE.to_string()),
        ("TREE_LOG", TREE_LOG.to_string()),
        ("TREE_ROOTS", TREE_ROOTS.to_string()),
        ("FIRST_SNAPSHOT_ID", FIRST_SNAPSHOT_ID.to_string()),
        ("FS_SUBVOL_ID", FS_SUBVOL_ID.to_string()),
        ("NODE_REFS_OBJECTID", NODE_REFS_OBJECTID.to_string()),
        ("HELD_OBJECTID", HELD_OBJECTID.to_string()),
        ("SUBVOL_READ_ONLY", roots::SUBVOL_READ_ONLY.to_string()),
        ("SUBVOL_DROPPING", roots::SUBVOL_DROPPING.to_string()),
        ("SUBVOL_WRITABLE", roots::SUBVOL_WRITABLE.to_string()),
        ("SUBVOL_HIDDEN", roots::SUBVOL_HIDDEN.to_string()),
        ("ORIGIN_ITEM_SIZE", roots::ORIGIN_ITEM_SIZE.to_string()),
        (
            "SUBVOLUME_ITEM_SIZE",
            roots::SUBVOLUME_ITEM_SIZE.to_string(),
        ),
        (
            "NODE_REFS_ITEM_SIZE",
            roots::NODE_REFS_ITEM_SIZE.to_string(),
        ),
        ("HELD_ITEM_SIZE", roots::HELD_ITEM_SIZE.to_string()),
        (
            "INCOMPAT_SUBVOLUMES",
            versions::INCOMPAT_SUBVOLUMES.to_string(),
        ),
        ("INCOMPAT_CLONES", versions::INCOMPAT_CLONES.to_string()),
        (
            "INCOMPAT_HIDDEN_ORIGINS",
            versions::INCOMPAT_HIDDEN_ORIGINS.to_string(),
        ),
        (
            "INCOMPAT_LOG_TREES",
            versions::INCOMPAT_LOG_TREES.to_string(),
        ),
        ("ROOT_INO", ROOT_INO.to_string()),
        ("FIRST_FREE_INO", FIRST_FREE_INO.to_string()),
        ("MAX_INO", MAX_INO.to_string()),
        ("ORPHAN_OBJECTID", ORPHAN_OBJECTID.to_string()),
        ("SHARED_OBJECTID", SHARED_OBJECTID.to_string()),
        ("NAME_MAX", NAME_MAX.to_string()),
        ("SYMLINK_MAX", SYMLINK_MAX.to_string()),
        ("CURRENT_VERSION", versions::CURRENT_VERSION.to_string()),
        ("SUPERBLOCK_SIZE", superblock::SUPERBLOCK_SIZE.to_string()),
        ("NODE_HEADER_SIZE", node::NODE_HEADER_SIZE.to_string()),
        ("ITEM_HEADER_SIZE", node::ITEM_HEADER_SIZE.to_string()),
        ("KEY_PTR_SIZE", node::KEY_PTR_SIZE.to_string()),
        ("KEY_SIZE", key::KEY_SIZE.to_string()),
        ("INODE_ITEM_SIZE", items::INODE_ITEM_SIZE.to_string()),
        ("EXTENT_ITEM_SIZE", items::EXTENT_ITEM_SIZE.to_string()),
        ("SHARED_ITEM_SIZE", items::SHARED_ITEM_SIZE.to_string()),
        (
            "BLOCK_GROUP_ITEM_SIZE",
            items::BLOCK_GROUP_ITEM_SIZE.to_string(),
        ),
        ("LOG_HEADER_SIZE", log::LOG_HEADER_SIZE.to_string()),
        ("LOG_RECORD_HEADER", log::LOG_RECORD_HEADER.to_string()),
        ("XATTR_VALUE_MAX", items::XATTR_VALUE_MAX.to_string()),
        ("XATTR_CHUNKS_MAX", items::XATTR_CHUNKS_MAX.to_string()),
        ("XATTR_LONG_HEADER", items::XATTR_LONG_HEADER.to_string()),
        ("ORPHAN_TRIM", items::ORPHAN_TRIM.to_string()),
        ("SUM_GROUP_BLOCKS", items::SUM_GROUP_BLOCKS.to_string()),
        ("BLOCK_SUMS_MAX", items::BLOCK_SUMS_MAX.to_string()),
        (
            "COMPAT_RO_DATA_SUMS",
            versions::COMPAT_RO_DATA_SUMS.to_string(),
        ),
        ("INCOMPAT_LOG", versions::INCOMPAT_LOG.to_string()),
        ("INCOMPAT_EXT_REF", versions::INCOMPAT_EXT_REF.to_string()),
        (
            "INCOMPAT_XATTR_CHUNKS",
            versions::INCOMPAT_XATTR_CHUNKS.to_string(),
        ),
        (
            "INCOMPAT_ORPHAN_TRIM",
            versions::INCOMPAT_ORPHAN_TRIM.to_string(),
        ),
        (
            "INCOMPAT_SHARED_BLOCKS",
            versions::INCOMPAT_SHARED_BLOCKS.to_string(),
        ),
    ];
    for t in ItemType::ALL {
        let name: &'static str = Box::leak(format!("{t:?}").into_boxed_str());
        expect.push((name, (t as u8).to_string()));
    }
    let got = rows(&doc());
    for (name, value) in &expect {
        let row = got
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("docs/format.md has no row for `{name}`"));
        assert_eq!(
            &row.1, value,
            "docs/format.md says `{name}` is {}, the code says {value}",
            row.1
        );
    }
    // And nothing in the checked tables that the code does not know.
    for (name, _) in &got {
        assert!(
            expect.iter().any(|(n, _)| n == name),
            "docs/format.md lists `{name}`, which this test does not check"
        );
    }
}
