//! Code archives for tests: a zip of `(path, content)` pairs, shared by the
//! end-to-end and the in-process test binaries.

use std::io::Write;

/// A zip archive (deflated) of `(path, content)` pairs.
pub fn zip(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    {
        let mut w = zip::ZipWriter::new(&mut out);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (path, content) in files {
            w.start_file(*path, opts).expect("zip entry");
            w.write_all(content).expect("zip write");
        }
        w.finish().expect("zip finish");
    }
    out.into_inner()
}
