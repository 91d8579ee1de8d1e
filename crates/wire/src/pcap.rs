//! Classic pcap files (the `tcpdump` format, not pcapng): a reader over a byte slice and a
//! writer into any [`std::io::Write`].
//!
//! Both byte orders and both timestamp resolutions (microseconds, magic `0xa1b2c3d4`, and
//! nanoseconds, magic `0xa1b23c4d`) are read; the writer produces little-endian,
//! microsecond files, which every tool reads.
//!
//! ```
//! use softrdma_wire::pcap::{PcapReader, PcapWriter, LINKTYPE_ETHERNET};
//! let mut file = Vec::new();
//! let mut w = PcapWriter::new(&mut file, LINKTYPE_ETHERNET, 65535).unwrap();
//! w.write_record(1, 500_000_000, &[1, 2, 3]).unwrap();
//! let r = PcapReader::new(&file).unwrap();
//! let recs: Vec<_> = r.records().collect::<Result<_, _>>().unwrap();
//! assert_eq!(recs[0].data, &[1, 2, 3]);
//! assert_eq!(recs[0].ts_nanos, 500_000_000);
//! ```

use crate::{Error, Result};
use std::io;

/// Link type of Ethernet frames (`DLT_EN10MB`).
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Link type of raw IP packets with no link-layer header (`DLT_RAW` as stored in files).
pub const LINKTYPE_RAW: u32 = 101;

const MAGIC_US: u32 = 0xa1b2_c3d4;
const MAGIC_NS: u32 = 0xa1b2_3c4d;
const GLOBAL_HEADER_LEN: usize = 24;
const RECORD_HEADER_LEN: usize = 16;

/// A classic pcap file held in memory.
#[derive(Debug, Clone)]
pub struct PcapReader<'a> {
    data: &'a [u8],
    big_endian: bool,
    nanos: bool,
    link_type: u32,
    snaplen: u32,
}

/// One captured packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcapRecord<'a> {
    /// Capture time, seconds since the Unix epoch.
    pub ts_sec: u32,
    /// Nanoseconds within that second (microsecond files are scaled up).
    pub ts_nanos: u32,
    /// Length of the packet on the wire, which may exceed `data.len()` when the capture was cut.
    pub orig_len: u32,
    /// The captured bytes.
    pub data: &'a [u8],
}

impl<'a> PcapReader<'a> {
    /// Reads the global header of a pcap file.
    ///
    /// Fails with [`Error::Truncated`] when the file is shorter than the 24-byte header and
    /// [`Error::Unsupported`] when the magic number is not one of classic pcap's (a pcapng
    /// file, for example).
    pub fn new(data: &'a [u8]) -> Result<Self> {
        if data.len() < GLOBAL_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let le = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let be = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
        let (big_endian, nanos) = match (le, be) {
            (MAGIC_US, _) => (false, false),
            (MAGIC_NS, _) => (false, true),
            (_, MAGIC_US) => (true, false),
            (_, MAGIC_NS) => (true, true),
            _ => return Err(Error::Unsupported),
        };
        let mut r = PcapReader {
            data,
            big_endian,
            nanos,
            link_type: 0,
            snaplen: 0,
        };
        r.snaplen = r.u32_at(16);
        r.link_type = r.u32_at(20) & 0x0fff_ffff;
        Ok(r)
    }

    fn u32_at(&self, at: usize) -> u32 {
        let b = [
            self.data[at],
            self.data[at + 1],
            self.data[at + 2],
            self.data[at + 3],
        ];
        if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }

    /// The link type of every record (1 = Ethernet).
    pub fn link_type(&self) -> u32 {
        self.link_type
    }

    /// The snapshot length the file declares.
    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// The records, in file order. A record whose header or data runs past the end of the
    /// file yields [`Error::Truncated`] and ends the iteration.
    pub fn records(&self) -> Records<'a> {
        Records {
            reader: self.clone(),
            at: GLOBAL_HEADER_LEN,
            done: false,
        }
    }
}

/// Iterator over the records of a [`PcapReader`].
#[derive(Debug, Clone)]
pub struct Records<'a> {
    reader: PcapReader<'a>,
    at: usize,
    done: bool,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<PcapRecord<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        let data = self.reader.data;
        if self.done || self.at == data.len() {
            return None;
        }
        if data.len() - self.at < RECORD_HEADER_LEN {
            self.done = true;
            return Some(Err(Error::Truncated));
        }
        let r = &self.reader;
        let ts_sec = r.u32_at(self.at);
        let frac = r.u32_at(self.at + 4);
        let incl = r.u32_at(self.at + 8) as usize;
        let orig_len = r.u32_at(self.at + 12);
        let start = self.at + RECORD_HEADER_LEN;
        if data.len() - start < incl {
            self.done = true;
            return Some(Err(Error::Truncated));
        }
        let ts_nanos = if r.nanos {
            frac
        } else {
            frac.saturating_mul(1000)
        };
        self.at = start + incl;
        Some(Ok(PcapRecord {
            ts_sec,
            ts_nanos,
            orig_len,
            data: &data[start..start + incl],
        }))
    }
}

/// Writes a classic, little-endian, microsecond-resolution pcap file.
#[derive(Debug)]
pub struct PcapWriter<W: io::Write> {
    out: W,
    snaplen: u32,
}

impl<W: io::Write> PcapWriter<W> {
    /// Writes the global header for records of `link_type`, cut at `snaplen` bytes.
    ///
    /// Fails with the I/O error of the underlying writer.
    pub fn new(mut out: W, link_type: u32, snaplen: u32) -> io::Result<Self> {
        let mut h = [0u8; GLOBAL_HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC_US.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        h[16..20].copy_from_slice(&snaplen.to_le_bytes());
        h[20..24].copy_from_slice(&link_type.to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out, snaplen })
    }

    /// Appends one packet captured at `ts_sec` seconds and `ts_nanos` nanoseconds (stored with
    /// microsecond resolution). Packets longer than the snapshot length are cut, keeping their
    /// original length in the record header.
    ///
    /// Fails with the I/O error of the underlying writer.
    pub fn write_record(&mut self, ts_sec: u32, ts_nanos: u32, data: &[u8]) -> io::Result<()> {
        let incl = data.len().min(self.snaplen as usize);
        let mut h = [0u8; RECORD_HEADER_LEN];
        h[0..4].copy_from_slice(&ts_sec.to_le_bytes());
        h[4..8].copy_from_slice(&(ts_nanos / 1000).to_le_bytes());
        h[8..12].copy_from_slice(&(incl as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(data.len().min(u32::MAX as usize) as u32).to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(&data[..incl])
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Returns the underlying writer.
    pub fn into_inner(self) -> W {
        self.out
    }

    /// The underlying writer, to be flushed or inspected in place (writing to it directly
    /// would corrupt the file's record structure).
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_short_and_unknown_files() {
        assert_eq!(PcapReader::new(&[0; 10]).unwrap_err(), Error::Truncated);
        assert_eq!(PcapReader::new(&[0; 24]).unwrap_err(), Error::Unsupported);
    }

    #[test]
    fn truncated_record_is_an_error_not_a_panic() {
        let mut file = Vec::new();
        let mut w = PcapWriter::new(&mut file, LINKTYPE_ETHERNET, 100).unwrap();
        w.write_record(0, 0, &[9; 20]).unwrap();
        let cut = &file[..file.len() - 1];
        let r = PcapReader::new(cut).unwrap();
        let v: Vec<_> = r.records().collect();
        assert_eq!(v, vec![Err(Error::Truncated)]);
        let cut = &file[..30];
        let v: Vec<_> = PcapReader::new(cut).unwrap().records().collect();
        assert_eq!(v, vec![Err(Error::Truncated)]);
    }

    #[test]
    fn reads_big_endian_nanosecond_files() {
        let mut f = vec![];
        f.extend_from_slice(&MAGIC_NS.to_be_bytes());
        f.extend_from_slice(&[
            0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 1,
        ]);
        f.extend_from_slice(&7u32.to_be_bytes());
        f.extend_from_slice(&123u32.to_be_bytes());
        f.extend_from_slice(&2u32.to_be_bytes());
        f.extend_from_slice(&2u32.to_be_bytes());
        f.extend_from_slice(&[0xaa, 0xbb]);
        let r = PcapReader::new(&f).unwrap();
        assert_eq!(r.link_type(), LINKTYPE_ETHERNET);
        assert_eq!(r.snaplen(), 0xffff);
        let rec = r.records().next().unwrap().unwrap();
        assert_eq!(
            (rec.ts_sec, rec.ts_nanos, rec.data),
            (7, 123, &[0xaa, 0xbb][..])
        );
    }

    #[test]
    fn writer_cuts_at_snaplen_and_keeps_orig_len() {
        let mut file = Vec::new();
        let mut w = PcapWriter::new(&mut file, LINKTYPE_RAW, 4).unwrap();
        w.write_record(0, 1_000, &[1, 2, 3, 4, 5, 6]).unwrap();
        let r = PcapReader::new(&file).unwrap();
        let rec = r.records().next().unwrap().unwrap();
        assert_eq!(rec.data, &[1, 2, 3, 4]);
        assert_eq!(rec.orig_len, 6);
        assert_eq!(rec.ts_nanos, 1_000);
    }
}
