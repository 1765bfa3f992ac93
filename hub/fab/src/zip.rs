//! The zip container of a FAB. [`write`] lays entries out byte for byte as CPython's `zipfile`
//! does for `flwr build` (3.10–3.13 agree): `writestr(ZipInfo(name, FAB_DATE), data)` stores
//! each entry uncompressed — a `ZipInfo` keeps `ZIP_STORED` whatever the archive's
//! `ZIP_DEFLATED` says — with version 2.0, no data descriptor, no extra fields, Unix mode 0600,
//! and the UTF-8 flag only on non-ASCII names. [`read`] takes any plain zip Python's `zipfile`
//! reads: stored or deflated entries, an optional comment, no zip64, no encryption.

use std::io::Read as _;

/// `FAB_DATE` (2024-10-01 00:00:00) as a DOS date.
const DOS_DATE: u16 = ((2024 - 1980) << 9) | (10 << 5) | 1;
/// `FAB_DATE`'s time of day as a DOS time.
const DOS_TIME: u16 = 0;
/// zipfile's `DEFAULT_VERSION` (2.0), made by and needed to extract.
const VERSION: u8 = 20;
/// zipfile's `create_system` on anything but Windows.
const SYSTEM_UNIX: u8 = 3;
/// General purpose flag bit 11: the name is UTF-8.
const FLAG_UTF8: u16 = 0x800;
/// General purpose flag bit 0: encrypted.
const FLAG_ENCRYPTED: u16 = 0x1;
/// `?rw-------`, what zipfile gives an entry without attributes.
const EXTERNAL_ATTR: u32 = 0o600 << 16;
const METHOD_STORED: u16 = 0;
const METHOD_DEFLATED: u16 = 8;
const LOCAL_SIG: &[u8; 4] = b"PK\x03\x04";
const CENTRAL_SIG: &[u8; 4] = b"PK\x01\x02";
const END_SIG: &[u8; 4] = b"PK\x05\x06";
const ZIP64_LOCATOR_SIG: &[u8; 4] = b"PK\x06\x07";
const LOCAL_LEN: usize = 30;
const CENTRAL_LEN: usize = 46;
const END_LEN: usize = 22;
/// Entries a zip without zip64 can count.
pub const MAX_ENTRIES: usize = u16::MAX as usize;

/// Size of the archive [`write`] makes of entries with these name and data lengths.
pub fn written_size(entries: impl IntoIterator<Item = (usize, usize)>) -> usize {
    entries
        .into_iter()
        .map(|(name, data)| LOCAL_LEN + CENTRAL_LEN + 2 * name + data)
        .sum::<usize>()
        + END_LEN
}

/// The archive of `entries`, in order. The caller keeps within [`MAX_ENTRIES`] entries and
/// 4 GiB (a FAB is at most 10 MiB).
pub fn write(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in entries {
        let offset = out.len() as u32;
        let flags = if name.is_ascii() { 0 } else { FLAG_UTF8 };
        let crc = crc32fast::hash(data);
        let size = data.len() as u32;
        let name_len = name.len() as u16;

        out.extend_from_slice(LOCAL_SIG);
        out.extend_from_slice(&[VERSION, 0]);
        for v in [flags, METHOD_STORED, DOS_TIME, DOS_DATE] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [crc, size, size] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in [name_len, 0] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);

        central.extend_from_slice(CENTRAL_SIG);
        central.extend_from_slice(&[VERSION, SYSTEM_UNIX, VERSION, 0]);
        for v in [flags, METHOD_STORED, DOS_TIME, DOS_DATE] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        for v in [crc, size, size] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        // name length, extra, comment, disk, internal attributes
        for v in [name_len, 0, 0, 0, 0] {
            central.extend_from_slice(&v.to_le_bytes());
        }
        central.extend_from_slice(&EXTERNAL_ATTR.to_le_bytes());
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let central_offset = out.len() as u32;
    let central_size = central.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(END_SIG);
    let count = entries.len() as u16;
    for v in [0, 0, count, count] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&central_size.to_le_bytes());
    out.extend_from_slice(&central_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// One entry read from an archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The name as stored (`/`-separated; a directory's ends in `/`).
    pub name: String,
    /// The uncompressed contents.
    pub data: Vec<u8>,
}

/// Why an archive cannot be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ZipError {
    /// The archive as a whole.
    Archive(String),
    /// One entry.
    Entry {
        /// The entry's name (lossy if not UTF-8).
        name: String,
        /// What is wrong.
        reason: String,
    },
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn archive(reason: &str) -> ZipError {
    ZipError::Archive(reason.to_owned())
}

/// The entries of `bytes`, in central-directory order, with at most `max_unpacked` bytes of
/// contents in all (a bound on what a small deflated archive may expand to).
pub fn read(bytes: &[u8], max_unpacked: u64) -> Result<Vec<Entry>, ZipError> {
    let search_from = bytes.len().saturating_sub(END_LEN + u16::MAX as usize);
    let end = bytes[search_from..]
        .windows(4)
        .rposition(|w| w == END_SIG)
        .map(|p| p + search_from)
        .ok_or_else(|| archive("no end-of-central-directory record"))?;
    let record = bytes
        .get(end..end + END_LEN)
        .ok_or_else(|| archive("truncated end-of-central-directory record"))?;
    let field = |at| u16_at(record, at).unwrap_or(u16::MAX);
    if field(4) != 0 || field(6) != 0 {
        return Err(archive("spans several disks"));
    }
    let count = field(10);
    let central_size = u32_at(record, 12).unwrap_or(u32::MAX);
    let central_offset = u32_at(record, 16).unwrap_or(u32::MAX);
    let zip64_locator = end >= 20 && bytes.get(end - 20..end - 16) == Some(ZIP64_LOCATOR_SIG);
    if zip64_locator || count == u16::MAX || central_size == u32::MAX || central_offset == u32::MAX
    {
        return Err(archive("uses zip64 extensions, which no FAB needs"));
    }
    // Bytes before the archive proper (a prefix), which zipfile tolerates.
    let concat = end
        .checked_sub(central_size as usize)
        .and_then(|v| v.checked_sub(central_offset as usize))
        .ok_or_else(|| archive("central directory offset points past its end"))?;
    let start = concat + central_offset as usize;
    let central = &bytes[start..start + central_size as usize];

    let mut entries = Vec::new();
    let mut unpacked: u64 = 0;
    let mut pos = 0;
    while pos < central.len() {
        let header = central
            .get(pos..pos + CENTRAL_LEN)
            .ok_or_else(|| archive("truncated central directory"))?;
        if &header[..4] != CENTRAL_SIG {
            return Err(archive("bad central directory entry signature"));
        }
        let get16 = |at| u16_at(header, at).unwrap_or(0);
        let get32 = |at| u32_at(header, at).unwrap_or(0);
        let (flags, method, crc) = (get16(8), get16(10), get32(16));
        let (packed, size) = (get32(20), get32(24));
        let (name_len, extra_len, comment_len) =
            (get16(28) as usize, get16(30) as usize, get16(32) as usize);
        let offset = get32(42);
        let raw_name = central
            .get(pos + CENTRAL_LEN..pos + CENTRAL_LEN + name_len)
            .ok_or_else(|| archive("truncated central directory"))?;
        pos += CENTRAL_LEN + name_len + extra_len + comment_len;

        let name = decode_name(raw_name, flags)?;
        let fail = |reason: &str| ZipError::Entry {
            name: name.clone(),
            reason: reason.to_owned(),
        };
        if packed == u32::MAX || size == u32::MAX || offset == u32::MAX {
            return Err(fail("uses zip64 extensions, which no FAB needs"));
        }
        if flags & FLAG_ENCRYPTED != 0 {
            return Err(fail("is encrypted"));
        }
        unpacked += u64::from(size);
        if unpacked > max_unpacked {
            return Err(archive(&format!(
                "unpacks to more than {max_unpacked} bytes"
            )));
        }
        let local_at = concat + offset as usize;
        let local = bytes
            .get(local_at..local_at + LOCAL_LEN)
            .filter(|h| &h[..4] == LOCAL_SIG)
            .ok_or_else(|| fail("has no local header where the central directory says"))?;
        let local_name_len = u16_at(local, 26).unwrap_or(0) as usize;
        let local_extra_len = u16_at(local, 28).unwrap_or(0) as usize;
        let data_at = local_at + LOCAL_LEN + local_name_len + local_extra_len;
        if bytes.get(local_at + LOCAL_LEN..local_at + LOCAL_LEN + local_name_len) != Some(raw_name)
        {
            return Err(fail("has a different name in its local header"));
        }
        let stored = bytes
            .get(data_at..data_at + packed as usize)
            .ok_or_else(|| fail("is truncated"))?;
        let data = match method {
            METHOD_STORED if packed == size => stored.to_vec(),
            METHOD_STORED => return Err(fail("is stored with two different sizes")),
            METHOD_DEFLATED => {
                let mut data = Vec::with_capacity(size as usize);
                flate2::read::DeflateDecoder::new(stored)
                    .take(u64::from(size) + 1)
                    .read_to_end(&mut data)
                    .map_err(|e| fail(&format!("does not inflate: {e}")))?;
                if data.len() != size as usize {
                    return Err(fail("inflates to a size other than its header says"));
                }
                data
            }
            other => {
                return Err(fail(&format!(
                    "uses compression method {other}; a FAB's entries are stored or deflated"
                )));
            }
        };
        if crc32fast::hash(&data) != crc {
            return Err(fail("fails its CRC-32 check"));
        }
        entries.push(Entry { name, data });
    }
    Ok(entries)
}

/// A name as zipfile decodes it; names that are neither flagged UTF-8 nor ASCII (zipfile would
/// read them as code page 437) are refused, since no FAB builder writes them.
fn decode_name(raw: &[u8], flags: u16) -> Result<String, ZipError> {
    let lossy = || String::from_utf8_lossy(raw).into_owned();
    if flags & FLAG_UTF8 == 0 && !raw.is_ascii() {
        return Err(ZipError::Entry {
            name: lossy(),
            reason: "has a name that is neither ASCII nor marked UTF-8".to_owned(),
        });
    }
    String::from_utf8(raw.to_vec()).map_err(|_| ZipError::Entry {
        name: lossy(),
        reason: "has a name marked UTF-8 that is not".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_archives_read_back() {
        let entries = [("a.py", &b"x = 1\n"[..]), ("pkg/é.md", b""), ("z", b"zz")];
        let bytes = write(&entries);
        assert_eq!(
            bytes.len(),
            written_size(entries.iter().map(|(n, d)| (n.len(), d.len())))
        );
        let back = read(&bytes, 1 << 20).expect("readable");
        let names: Vec<&str> = back.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["a.py", "pkg/é.md", "z"]);
        assert_eq!(back[0].data, b"x = 1\n");
    }

    #[test]
    fn an_empty_archive_is_just_the_end_record() {
        assert_eq!(write(&[]).len(), END_LEN);
        assert_eq!(read(&write(&[]), 0), Ok(vec![]));
    }
}
