//! A run's outputs copied out of the SuperLink, each file checked against its listed size and
//! hash.
use super::*;

/// Checks bytes as they arrive against a listing entry.
pub(super) struct Verify<'a> {
    file: &'a RunOutput,
    expected: u64,
    size: u64,
    hasher: Sha256,
}

impl<'a> Verify<'a> {
    pub(super) fn new(file: &'a RunOutput) -> Result<Self, OutputsError> {
        Ok(Self {
            expected: listed_size(file)?,
            file,
            size: 0,
            hasher: Sha256::new(),
        })
    }

    pub(super) fn update(&mut self, bytes: &[u8]) -> Result<(), OutputsError> {
        self.size += bytes.len() as u64;
        if self.size > self.expected {
            return Err(self.changed(format!(
                "it has more than the {} bytes listed",
                self.expected
            )));
        }
        self.hasher.update(bytes);
        Ok(())
    }

    pub(super) fn finish(self) -> Result<(), OutputsError> {
        if self.size != self.expected {
            return Err(self.changed(format!(
                "it has {} bytes, the listing says {}",
                self.size, self.expected
            )));
        }
        let sha256 = hex::encode(self.hasher.finalize());
        if sha256 != self.file.sha256 {
            return Err(OutputsError::Changed {
                path: self.file.path.clone(),
                why: format!(
                    "its sha256 is {sha256}, the listing says {}",
                    self.file.sha256
                ),
            });
        }
        Ok(())
    }

    pub(super) fn changed(&self, why: String) -> OutputsError {
        OutputsError::Changed {
            path: self.file.path.clone(),
            why,
        }
    }
}

/// Where a file with path `segments` lands below `dest_dir`, and its `.part` file beside it.
pub(super) fn destination(dest_dir: &Path, segments: &[&str]) -> (PathBuf, PathBuf) {
    let dest: PathBuf = segments
        .iter()
        .fold(dest_dir.to_path_buf(), |p, s| p.join(s));
    let mut part = dest.clone().into_os_string();
    part.push(".part");
    (dest, PathBuf::from(part))
}

/// Copies the listed `files` from the run directory `src_dir` into `dest_dir` (standalone mode):
/// each is streamed into `<dest>.part`, checked against its listed size and SHA-256 and renamed
/// into place; parent directories are created. A path that could leave either directory, a
/// symlink, or a file that changed since it was listed is an error naming the file.
pub fn copy_verified(
    src_dir: &Path,
    files: &[RunOutput],
    dest_dir: &Path,
) -> Result<(), OutputsError> {
    // Check every entry before copying any.
    let checked = files
        .iter()
        .map(|file| Ok((file, segments(&file.path)?, listed_size(file)?)))
        .collect::<Result<Vec<_>, OutputsError>>()?;
    if checked.is_empty() {
        return Ok(());
    }
    let src = nix::fcntl::open(src_dir, dir_flags(), Mode::empty())
        .map_err(|e| OutputsError::io(src_dir, e))?;
    for (file, segments, _) in checked {
        let from = src_dir.join(&file.path);
        let mut input = open_beneath(src.as_fd(), &segments)
            .map_err(|e| OutputsError::opening(src_dir, &file.path, e))?;
        let (dest, part) = destination(dest_dir, &segments);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| OutputsError::io(parent, e))?;
        }
        let copied = copy_one(&mut input, &from, &part, file);
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
        std::fs::rename(&part, &dest).map_err(|e| OutputsError::io(&dest, e))?;
    }
    Ok(())
}

pub(super) fn copy_one(
    input: &mut File,
    from: &Path,
    part: &Path,
    file: &RunOutput,
) -> Result<(), OutputsError> {
    let mut verify = Verify::new(file)?;
    let mut out = File::create(part).map_err(|e| OutputsError::io(part, e))?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(OutputsError::io(from, e)),
        };
        verify.update(&buf[..n])?;
        out.write_all(&buf[..n])
            .map_err(|e| OutputsError::io(part, e))?;
    }
    verify.finish()?;
    out.sync_all().map_err(|e| OutputsError::io(part, e))
}
