//! A directory as content-addressed chunks, and what a node lacks of it.
//!
//! A [`Manifest`] lists the regular files under a directory (symbolic links followed, sorted
//! by path), each cut into chunks of [`Manifest::chunk_size`] bytes with the blake3 hash of
//! every chunk. A file's hash is blake3 over its chunk hashes in order (a two-level tree), so
//! it is known from the chunks without a second pass over the bytes. Chunks are numbered
//! across the whole manifest (file by file), and a set of chunks is a [`Bits`].
//!
//! What a node needs is a pure function of the manifest and the chunk hashes it found on its
//! own disk ([`Local`]): a chunk is needed unless the node's copy of the same range hashes the
//! same. Resume after an interruption and skipping unchanged files are both that rule.

use std::fs::File;
use std::io::Read;
use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use crate::{LaunchError, io};

/// The default chunk size: 4 MiB.
pub const CHUNK: u64 = 4 << 20;

/// The name of the suffix under which a file is written until it is complete.
pub const PART_SUFFIX: &str = ".weft-part";

/// A blake3 hash, as lower-case hex in JSON.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hash(pub [u8; 32]);

impl Hash {
    pub fn of(data: &[u8]) -> Hash {
        Hash(*blake3::hash(data).as_bytes())
    }
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
    /// The first 12 hex digits, for messages.
    pub fn short(&self) -> String {
        self.hex()[..12].to_string()
    }
}

impl std::fmt::Debug for Hash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.short())
    }
}

impl Serialize for Hash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Hash, D::Error> {
        let s = String::deserialize(d)?;
        let b = s.as_bytes();
        if b.len() != 64 {
            return Err(serde::de::Error::custom(format!(
                "a hash has 64 hex digits, not {}",
                b.len()
            )));
        }
        let mut h = [0u8; 32];
        for (i, pair) in b.chunks(2).enumerate() {
            let t = std::str::from_utf8(pair).map_err(serde::de::Error::custom)?;
            h[i] = u8::from_str_radix(t, 16).map_err(serde::de::Error::custom)?;
        }
        Ok(Hash(h))
    }
}

/// The hash of a file: blake3 over its chunk hashes.
pub fn file_hash(chunks: &[Hash]) -> Hash {
    let mut h = blake3::Hasher::new();
    for c in chunks {
        h.update(&c.0);
    }
    Hash(*h.finalize().as_bytes())
}

/// One file of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Relative path, `/`-separated, no `..`.
    pub path: String,
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// [`file_hash`] of `chunks`.
    pub hash: Hash,
    pub chunks: Vec<Hash>,
}

/// A directory as chunks. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub chunk_size: u64,
    pub files: Vec<FileEntry>,
}

/// What changes when a file's bytes do: its identity, size, and modification and change
/// times (nanoseconds). Taken before a file is hashed, so that a write during the hashing
/// shows as a different stamp afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl Stamp {
    pub fn of(m: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt as _;
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        }
    }
}

/// Where a chunk lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRef {
    pub file: usize,
    pub offset: u64,
    pub len: u64,
}

impl Manifest {
    /// Scans `dir`: every regular file under it (symbolic links followed), sorted by path.
    /// `.weft-sync` and `*.weft-part` are left out.
    pub fn scan(dir: &Path, chunk_size: u64) -> Result<Manifest, LaunchError> {
        Self::scan_stamped(dir, chunk_size).map(|(m, _)| m)
    }

    /// [`Manifest::scan`], with each file's [`Stamp`] as it was before its bytes were hashed:
    /// a source that finds the same stamp when it sends a chunk need not hash the chunk again.
    pub fn scan_stamped(
        dir: &Path,
        chunk_size: u64,
    ) -> Result<(Manifest, Vec<Stamp>), LaunchError> {
        if chunk_size == 0 {
            return Err(LaunchError::Usage("chunk size 0".into()));
        }
        let meta = std::fs::metadata(dir).map_err(io(format!("{}", dir.display())))?;
        if !meta.is_dir() {
            return Err(LaunchError::Usage(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        let mut paths = Vec::new();
        walk(dir, "", &mut paths, 0)?;
        paths.sort();
        let mut files = Vec::with_capacity(paths.len());
        let mut stamps = Vec::with_capacity(paths.len());
        for rel in paths {
            let full = dir.join(&rel);
            let meta = std::fs::metadata(&full).map_err(io(full.display().to_string()))?;
            let (chunks, size) = hash_chunks(&full, chunk_size, None)?;
            let mode = {
                use std::os::unix::fs::PermissionsExt as _;
                meta.permissions().mode() & 0o7777
            };
            stamps.push(Stamp::of(&meta));
            files.push(FileEntry {
                hash: file_hash(&chunks),
                path: rel,
                size,
                mode,
                chunks,
            });
        }
        Ok((Manifest { chunk_size, files }, stamps))
    }

    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    pub fn chunk_count(&self) -> usize {
        self.files.iter().map(|f| f.chunks.len()).sum()
    }

    /// Where every chunk lies, in chunk order.
    pub fn chunk_refs(&self) -> Vec<ChunkRef> {
        let mut v = Vec::with_capacity(self.chunk_count());
        for (fi, f) in self.files.iter().enumerate() {
            for (ci, _) in f.chunks.iter().enumerate() {
                let offset = ci as u64 * self.chunk_size;
                v.push(ChunkRef {
                    file: fi,
                    offset,
                    len: (f.size - offset).min(self.chunk_size),
                });
            }
        }
        v
    }

    /// The hash of chunk `i` (in chunk order), if there is one.
    pub fn chunk_hashes(&self) -> Vec<Hash> {
        self.files
            .iter()
            .flat_map(|f| f.chunks.iter().copied())
            .collect()
    }

    /// Checks what a node is about to trust: paths relative and clean, chunk counts and
    /// file hashes consistent with the sizes.
    pub fn validate(&self) -> Result<(), LaunchError> {
        if self.chunk_size == 0 {
            return Err(LaunchError::Usage("manifest: chunk_size 0".into()));
        }
        let mut prev: Option<&str> = None;
        for f in &self.files {
            check_rel_path(&f.path)?;
            if prev.is_some_and(|p| p >= f.path.as_str()) {
                return Err(LaunchError::Usage(format!(
                    "manifest: {:?} is out of order or repeated",
                    f.path
                )));
            }
            prev = Some(&f.path);
            if f.chunks.len() as u64 != f.size.div_ceil(self.chunk_size) {
                return Err(LaunchError::Usage(format!(
                    "manifest: {} has {} chunks for {} bytes",
                    f.path,
                    f.chunks.len(),
                    f.size
                )));
            }
            if file_hash(&f.chunks) != f.hash {
                return Err(LaunchError::Usage(format!(
                    "manifest: {}: file hash does not match its chunks",
                    f.path
                )));
            }
        }
        Ok(())
    }
}

/// A relative path that stays inside the destination: no `..`, no root, no empty part.
pub fn check_rel_path(p: &str) -> Result<(), LaunchError> {
    let bad = |why: &str| LaunchError::Usage(format!("manifest path {p:?}: {why}"));
    if p.is_empty() {
        return Err(bad("empty"));
    }
    if p.ends_with(PART_SUFFIX) {
        return Err(bad("ends with the suffix of partial files"));
    }
    for c in Path::new(p).components() {
        match c {
            Component::Normal(s) if s != ".weft-sync" => {}
            _ => return Err(bad("must be relative, without `.`, `..` or `.weft-sync`")),
        }
    }
    if p.contains("//") || p.ends_with('/') {
        return Err(bad("empty component"));
    }
    Ok(())
}

fn walk(dir: &Path, rel: &str, out: &mut Vec<String>, depth: usize) -> Result<(), LaunchError> {
    if depth > 64 {
        return Err(LaunchError::Usage(format!(
            "{}: more than 64 levels deep (a symbolic link loop?)",
            dir.display()
        )));
    }
    let rd = std::fs::read_dir(dir).map_err(io(format!("read {}", dir.display())))?;
    for e in rd {
        let e = e.map_err(io(format!("read {}", dir.display())))?;
        let name = e.file_name();
        let Some(name) = name.to_str() else {
            return Err(LaunchError::Usage(format!(
                "{}: a name that is not UTF-8: {:?}",
                dir.display(),
                e.file_name()
            )));
        };
        if name == ".weft-sync" || name.ends_with(PART_SUFFIX) {
            continue;
        }
        let child_rel = if rel.is_empty() {
            name.to_string()
        } else {
            format!("{rel}/{name}")
        };
        let path = e.path();
        // Follows symbolic links (a Hugging Face snapshot is links into its blobs).
        let m = std::fs::metadata(&path).map_err(io(path.display().to_string()))?;
        if m.is_dir() {
            walk(&path, &child_rel, out, depth + 1)?;
        } else if m.is_file() {
            out.push(child_rel);
        }
    }
    Ok(())
}

/// Hashes `path` chunk by chunk, at most `limit` bytes; the hashes and the bytes read.
pub fn hash_chunks(
    path: &Path,
    chunk_size: u64,
    limit: Option<u64>,
) -> Result<(Vec<Hash>, u64), LaunchError> {
    let mut f = File::open(path).map_err(io(format!("open {}", path.display())))?;
    let mut buf = vec![0u8; chunk_size as usize];
    let mut hashes = Vec::new();
    let mut total = 0u64;
    loop {
        let want = match limit {
            Some(l) if l - total < chunk_size => (l - total) as usize,
            _ => chunk_size as usize,
        };
        if want == 0 {
            break;
        }
        let n =
            read_full(&mut f, &mut buf[..want]).map_err(io(format!("read {}", path.display())))?;
        if n == 0 {
            break;
        }
        hashes.push(Hash::of(&buf[..n]));
        total += n as u64;
        if n < want {
            break;
        }
    }
    Ok((hashes, total))
}

fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A set of chunk numbers.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Bits {
    len: usize,
    words: Vec<u64>,
}

impl std::fmt::Debug for Bits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bits({}/{})", self.count(), self.len)
    }
}

impl Bits {
    pub fn new(len: usize) -> Bits {
        Bits {
            len,
            words: vec![0; len.div_ceil(64)],
        }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn get(&self, i: usize) -> bool {
        i < self.len && self.words[i / 64] >> (i % 64) & 1 == 1
    }
    pub fn set(&mut self, i: usize) {
        if i < self.len {
            self.words[i / 64] |= 1 << (i % 64);
        }
    }
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }
    /// `self |= other` (same length).
    pub fn union(&mut self, other: &Bits) {
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= b;
        }
    }
    /// Lower-case hex of the little-endian words, for the wire.
    pub fn to_hex(&self) -> String {
        self.words.iter().map(|w| format!("{w:016x}")).collect()
    }
    pub fn from_hex(len: usize, s: &str) -> Result<Bits, LaunchError> {
        let n = len.div_ceil(64);
        if s.len() != n * 16 {
            return Err(LaunchError::Usage(format!(
                "a set of {len} chunks has {} hex digits, not {}",
                n * 16,
                s.len()
            )));
        }
        let mut words = Vec::with_capacity(n);
        for i in 0..n {
            let w = u64::from_str_radix(&s[i * 16..i * 16 + 16], 16)
                .map_err(|e| LaunchError::Usage(format!("chunk set: {e}")))?;
            words.push(w);
        }
        if !len.is_multiple_of(64) && n > 0 && words[n - 1] >> (len % 64) != 0 {
            return Err(LaunchError::Usage("chunk set: bits past the end".into()));
        }
        Ok(Bits { len, words })
    }
}

/// What a node found of one manifest file on its disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Neither the file nor a partial copy.
    Missing,
    /// The final file, with the hashes of its chunks over the manifest's size, and its size.
    Final { chunks: Vec<Hash>, size: u64 },
    /// A partial copy (`*.weft-part`) left by an interrupted sync.
    Part { chunks: Vec<Hash> },
}

/// What a node found of every manifest file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    pub files: Vec<Found>,
}

/// What a node needs, by file and by chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    /// Chunks to receive.
    pub chunks: Bits,
    /// Files whose final copy is missing or wrong (and will be rewritten), in manifest order.
    pub files: Vec<usize>,
    /// Of those, files that existed complete-sized but differed from the source.
    pub changed: Vec<usize>,
    /// Files complete in a partial copy: only the rename is left.
    pub rename_only: Vec<usize>,
}

/// The rule of the module docs: a chunk is needed unless the node's copy of the same range
/// hashes the same. A final file of another size is rewritten even where its chunks match.
pub fn need(m: &Manifest, local: &Local) -> Need {
    let mut chunks = Bits::new(m.chunk_count());
    let (mut files, mut changed, mut rename_only) = (Vec::new(), Vec::new(), Vec::new());
    let mut base = 0usize;
    for (fi, f) in m.files.iter().enumerate() {
        let have: &[Hash] = match local.files.get(fi) {
            Some(Found::Final { chunks, size }) if *size == f.size => chunks,
            Some(Found::Part { chunks }) => chunks,
            _ => &[],
        };
        let mut any = false;
        for (ci, h) in f.chunks.iter().enumerate() {
            if have.get(ci) != Some(h) {
                chunks.set(base + ci);
                any = true;
            }
        }
        match local.files.get(fi) {
            Some(Found::Final { size, .. }) if *size == f.size && !any => {}
            Some(Found::Final { .. }) => {
                files.push(fi);
                changed.push(fi);
            }
            Some(Found::Part { .. }) if !any => {
                files.push(fi);
                rename_only.push(fi);
            }
            _ => files.push(fi),
        }
        base += f.chunks.len();
    }
    Need {
        chunks,
        files,
        changed,
        rename_only,
    }
}

/// Looks at `dest` for every file of `m`: the partial copy when there is one, else the final
/// file; hashes what is there (at most the manifest's size of each).
pub fn look(dest: &Path, m: &Manifest) -> Result<Local, LaunchError> {
    let mut files = Vec::with_capacity(m.files.len());
    for f in &m.files {
        let final_path = dest.join(&f.path);
        let part = part_path(&final_path);
        let found = if part.is_file() {
            Found::Part {
                chunks: hash_chunks(&part, m.chunk_size, Some(f.size))?.0,
            }
        } else if final_path.is_file() {
            let size = std::fs::metadata(&final_path)
                .map_err(io(final_path.display().to_string()))?
                .len();
            Found::Final {
                chunks: hash_chunks(&final_path, m.chunk_size, Some(f.size))?.0,
                size,
            }
        } else {
            Found::Missing
        };
        files.push(found);
    }
    Ok(Local { files })
}

/// `path` with [`PART_SUFFIX`] appended.
pub fn part_path(path: &Path) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(PART_SUFFIX);
    s.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(b: u8) -> Hash {
        Hash::of(&[b])
    }

    fn manifest() -> Manifest {
        let files = vec![
            ("a", 10u64, vec![h(1), h(2), h(3)]),
            ("b", 0, vec![]),
            ("c/d", 4, vec![h(4)]),
        ];
        Manifest {
            chunk_size: 4,
            files: files
                .into_iter()
                .map(|(p, size, chunks)| FileEntry {
                    path: p.into(),
                    size,
                    mode: 0o644,
                    hash: file_hash(&chunks),
                    chunks,
                })
                .collect(),
        }
    }

    fn need_of(local: Vec<Found>) -> (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>) {
        let m = manifest();
        let n = need(&m, &Local { files: local });
        let bits = (0..m.chunk_count()).filter(|&i| n.chunks.get(i)).collect();
        (bits, n.files, n.changed, n.rename_only)
    }

    #[test]
    fn a_bare_node_needs_everything() {
        let (bits, files, changed, _) = need_of(vec![Found::Missing; 3]);
        assert_eq!(bits, [0, 1, 2, 3]);
        assert_eq!(files, [0, 1, 2]);
        assert!(changed.is_empty());
    }

    #[test]
    fn an_unchanged_file_is_skipped_and_a_changed_chunk_is_resent() {
        let (bits, files, changed, _) = need_of(vec![
            Found::Final {
                chunks: vec![h(1), h(9), h(3)],
                size: 10,
            },
            Found::Final {
                chunks: vec![],
                size: 0,
            },
            Found::Final {
                chunks: vec![h(4)],
                size: 4,
            },
        ]);
        assert_eq!(bits, [1]);
        assert_eq!(files, [0]);
        assert_eq!(changed, [0]);
    }

    #[test]
    fn an_interrupted_copy_resumes_after_its_last_good_chunk() {
        let (bits, files, changed, rename) = need_of(vec![
            Found::Part {
                chunks: vec![h(1), h(2)],
            },
            Found::Missing,
            Found::Part { chunks: vec![h(4)] },
        ]);
        assert_eq!(bits, [2]);
        assert_eq!(files, [0, 1, 2]);
        assert!(changed.is_empty());
        assert_eq!(rename, [2]);
    }

    #[test]
    fn a_final_file_of_another_size_is_rewritten() {
        let (bits, files, changed, _) = need_of(vec![
            Found::Final {
                chunks: vec![h(1), h(2), h(3)],
                size: 12,
            },
            Found::Final {
                chunks: vec![],
                size: 0,
            },
            Found::Final {
                chunks: vec![h(4)],
                size: 4,
            },
        ]);
        assert_eq!(bits, [0, 1, 2]);
        assert_eq!(files, [0]);
        assert_eq!(changed, [0]);
    }

    #[test]
    fn paths_that_leave_the_destination_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            ".weft-sync/x",
            "a.weft-part",
        ] {
            assert!(check_rel_path(bad).is_err(), "{bad}");
        }
        check_rel_path("a/b.safetensors").unwrap();
        let mut m = manifest();
        m.validate().unwrap();
        m.files[0].chunks.pop();
        assert!(m.validate().unwrap_err().to_string().contains("2 chunks"));
    }

    #[test]
    fn bit_sets_round_trip_and_refuse_garbage() {
        let mut b = Bits::new(70);
        b.set(0);
        b.set(69);
        let s = b.to_hex();
        assert_eq!(Bits::from_hex(70, &s).unwrap(), b);
        assert!(Bits::from_hex(71, "00").is_err());
        assert!(Bits::from_hex(3, "0000000000000008").is_err());
        let mut u = Bits::new(70);
        u.set(5);
        u.union(&b);
        assert_eq!(u.count(), 3);
    }

    #[test]
    fn a_stamp_stays_while_a_file_is_unchanged_and_moves_when_it_is_written() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), b"0123456789").unwrap();
        std::fs::write(d.path().join("b"), b"xyz").unwrap();
        let (m, stamps) = Manifest::scan_stamped(d.path(), 4).unwrap();
        assert_eq!(m, Manifest::scan(d.path(), 4).unwrap());
        assert_eq!(stamps.len(), 2);
        let now = |p: &str| Stamp::of(&std::fs::metadata(d.path().join(p)).unwrap());
        // Reading does not move it.
        let _ = std::fs::read(d.path().join("a")).unwrap();
        assert_eq!(now("a"), stamps[0]);
        // A write does (its size here; its times in general).
        std::fs::write(d.path().join("a"), b"0123456789!").unwrap();
        assert_ne!(now("a"), stamps[0]);
        // A file replaced by another of the same size is another inode.
        std::fs::write(d.path().join("b2"), b"xyw").unwrap();
        std::fs::rename(d.path().join("b2"), d.path().join("b")).unwrap();
        assert_ne!(now("b"), stamps[1]);
    }

    #[test]
    fn scan_chunks_and_hashes_a_directory() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/x"), b"0123456789").unwrap();
        std::fs::write(d.path().join("e"), b"").unwrap();
        std::fs::write(d.path().join("y.weft-part"), b"zz").unwrap();
        std::os::unix::fs::symlink("sub/x", d.path().join("link")).unwrap();
        let m = Manifest::scan(d.path(), 4).unwrap();
        let paths: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["e", "link", "sub/x"]);
        assert_eq!(m.files[2].chunks.len(), 3);
        assert_eq!(m.files[2].chunks[2], Hash::of(b"89"));
        assert_eq!(m.files[1].hash, m.files[2].hash);
        m.validate().unwrap();
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap(), m);
        // The same directory as a destination needs nothing.
        let local = look(d.path(), &m).unwrap();
        let n = need(&m, &local);
        assert_eq!(n.chunks.count(), 0);
        assert!(n.files.is_empty());
    }
}
