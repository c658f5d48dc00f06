//! pprof profiles: counted stacks in, a gzipped `profile.proto` out, as
//! `go tool pprof` reads it. A tool hands [`Builder`] each distinct stack with
//! its count (already symbolized, in this module's plain types, so that any
//! stage above can feed it: stackcount's summaries, or a snapshot of counts
//! served over HTTP); the builder deduplicates strings, functions, locations
//! and mappings, and [`Builder::finish`] gives the encoded file.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use flate2::write::GzEncoder;
use prost::Message;

pub mod proto;

/// What a sample stands for beyond its count, for sampling sources: each
/// sample is `period` of something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampling {
    /// Timed samples (`profile:`): each is `ns` nanoseconds of CPU.
    CpuNanos(u64),
    /// Counter samples (`software:`, `hardware:`): each is `n` events.
    Events(u64),
}

/// The file a frame's address falls in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mapping {
    pub start: u64,
    pub limit: u64,
    /// Where in the file `start` is.
    pub offset: u64,
    /// The file's path, or a name in brackets (`[kernel.kallsyms]`, `[vdso]`).
    pub file: String,
    /// Hex, as `readelf -n` prints it; empty when unknown.
    pub build_id: String,
}

/// One function at a frame's address: the function itself, or a call inlined
/// there. `file` may be empty and `line` 0 when unknown.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Line {
    pub function: String,
    pub file: String,
    pub line: i64,
}

/// One frame of a stack.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// 0 when unknown.
    pub addr: u64,
    /// Innermost first: calls inlined at `addr`, then the function it is in
    /// (pprof's order).
    pub lines: Vec<Line>,
    pub mapping: Option<Mapping>,
}

/// A sample's label: a string, or a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Label {
    Str(&'static str, String),
    Num(&'static str, i64),
}

/// Builds one profile: [`Builder::add`] each stack, then [`Builder::finish`].
pub struct Builder {
    sampling: Option<Sampling>,
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    functions: HashMap<(String, String), u64>,
    locations: HashMap<Frame, u64>,
    mappings: HashMap<Mapping, u64>,
    /// Whether any frame had inlined calls (the mappings say so).
    inlined: bool,
    /// Mappings with a frame given a source file and line (they say so).
    with_lines: std::collections::HashSet<u64>,
    profile: proto::Profile,
}

impl Builder {
    /// A profile of counted stacks; `sampling` adds a second value per sample
    /// (the count times the period) and the profile's period.
    pub fn new(sampling: Option<Sampling>) -> Builder {
        let mut b = Builder {
            sampling,
            strings: Vec::new(),
            string_ids: HashMap::new(),
            functions: HashMap::new(),
            locations: HashMap::new(),
            mappings: HashMap::new(),
            inlined: false,
            with_lines: std::collections::HashSet::new(),
            profile: proto::Profile::default(),
        };
        b.string(""); // index 0, as the format requires
        let count = b.value_type("samples", "count");
        b.profile.sample_type.push(count);
        if let Some(s) = sampling {
            let (vt, period) = match s {
                Sampling::CpuNanos(ns) => (b.value_type("cpu", "nanoseconds"), ns),
                Sampling::Events(n) => (b.value_type("events", "count"), n),
            };
            b.profile.sample_type.push(vt.clone());
            b.profile.period_type = Some(vt);
            b.profile.period = clamp(period);
        }
        b
    }

    /// Adds a stack (leaf first) counted `count` times, with its labels.
    pub fn add(&mut self, stack: &[Frame], count: u64, labels: &[Label]) {
        let location_id = stack.iter().map(|f| self.location(f)).collect();
        let mut value = vec![clamp(count)];
        match self.sampling {
            Some(Sampling::CpuNanos(p) | Sampling::Events(p)) => {
                value.push(clamp(count.saturating_mul(p)))
            }
            None => {}
        }
        let label = labels
            .iter()
            .map(|l| match l {
                Label::Str(k, v) => proto::Label {
                    key: self.string(k),
                    str: self.string(v),
                    ..Default::default()
                },
                Label::Num(k, n) => proto::Label {
                    key: self.string(k),
                    num: *n,
                    ..Default::default()
                },
            })
            .collect();
        self.profile.sample.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }

    /// The profile of what was added, collected from `start` for `duration`.
    pub fn finish(mut self, start: SystemTime, duration: Duration) -> proto::Profile {
        let since_epoch = start.duration_since(UNIX_EPOCH).unwrap_or_default();
        self.profile.time_nanos = clamp_i(since_epoch.as_nanos());
        self.profile.duration_nanos = clamp_i(duration.as_nanos());
        for m in &mut self.profile.mapping {
            m.has_inline_frames = self.inlined;
            m.has_filenames = self.with_lines.contains(&m.id);
            m.has_line_numbers = m.has_filenames;
        }
        self.profile.string_table = self.strings;
        self.profile
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_string());
        self.string_ids.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, ty: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(ty),
            unit: self.string(unit),
        }
    }

    fn function(&mut self, name: &str, file: &str) -> u64 {
        let key = (name.to_string(), file.to_string());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let f = proto::Function {
            id,
            name: self.string(name),
            system_name: self.string(name),
            filename: self.string(file),
            start_line: 0,
        };
        self.profile.function.push(f);
        self.functions.insert(key, id);
        id
    }

    fn mapping(&mut self, m: &Mapping) -> u64 {
        if let Some(&id) = self.mappings.get(m) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let pm = proto::Mapping {
            id,
            memory_start: m.start,
            memory_limit: m.limit,
            file_offset: m.offset,
            filename: self.string(&m.file),
            build_id: self.string(&m.build_id),
            // Frames come named: pprof must not symbolize them again from the
            // files (which may have changed, or be on another machine).
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        };
        self.profile.mapping.push(pm);
        self.mappings.insert(m.clone(), id);
        id
    }

    fn location(&mut self, f: &Frame) -> u64 {
        if let Some(&id) = self.locations.get(f) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        let mapping_id = f.mapping.as_ref().map_or(0, |m| self.mapping(m));
        let line = f
            .lines
            .iter()
            .map(|l| proto::Line {
                function_id: self.function(&l.function, &l.file),
                line: l.line,
                column: 0,
            })
            .collect();
        self.inlined |= f.lines.len() > 1;
        if f.lines.iter().any(|l| !l.file.is_empty()) {
            self.with_lines.insert(mapping_id);
        }
        self.profile.location.push(proto::Location {
            id,
            mapping_id,
            address: f.addr,
            line,
            is_folded: false,
        });
        self.locations.insert(f.clone(), id);
        id
    }
}

/// `profile`, encoded and gzipped: the bytes of a `.pb.gz` file.
pub fn encode(profile: &proto::Profile) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    gz.write_all(&profile.encode_to_vec())
        .expect("gzip to memory");
    gz.finish().expect("gzip to memory")
}

/// Writes `profile` to `path`, gzipped.
pub fn write(path: &Path, profile: &proto::Profile) -> Result<()> {
    std::fs::write(path, encode(profile))
        .with_context(|| format!("writing the pprof profile {}", path.display()))
}

/// The file of interval `n` (from 1) of a run writing `path`: `n` before the
/// extension, `.pb.gz` counted as one (`out.pb.gz` is `out.1.pb.gz`,
/// `cpu.prof` is `cpu.1.prof`, `cpu` is `cpu.1`).
pub fn numbered(path: &Path, n: u64) -> PathBuf {
    let name = path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let cut = match name.strip_suffix(".pb.gz") {
        Some(stem) if !stem.is_empty() => Some(stem.len()),
        _ => name.rfind('.').filter(|&i| i > 0),
    };
    let numbered = match cut {
        Some(i) => format!("{}.{n}{}", &name[..i], &name[i..]),
        None => format!("{name}.{n}"),
    };
    path.with_file_name(numbered)
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn clamp_i(n: u128) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::read::GzDecoder;
    use std::io::Read;

    fn frame(addr: u64, names: &[&str], m: Option<&Mapping>) -> Frame {
        Frame {
            addr,
            lines: names
                .iter()
                .map(|n| Line {
                    function: n.to_string(),
                    file: String::new(),
                    line: 0,
                })
                .collect(),
            mapping: m.cloned(),
        }
    }

    fn decode(bytes: &[u8]) -> proto::Profile {
        let mut raw = Vec::new();
        GzDecoder::new(bytes).read_to_end(&mut raw).unwrap();
        proto::Profile::decode(raw.as_slice()).unwrap()
    }

    fn s(p: &proto::Profile, i: i64) -> &str {
        &p.string_table[i as usize]
    }

    #[test]
    fn pprof_round_trip_decodes_what_it_encodes() {
        let exe = Mapping {
            start: 0x1000,
            limit: 0x2000,
            offset: 0x1000,
            file: "/bin/leaf".into(),
            build_id: "abcd".into(),
        };
        let kernel = Mapping {
            start: 0xffff_0000_0000_0000,
            limit: u64::MAX,
            offset: 0,
            file: "[kernel.kallsyms]".into(),
            build_id: String::new(),
        };
        let leaf = frame(0x1100, &["inner", "tk_leaf"], Some(&exe));
        let a = frame(0x1200, &["via_one"], Some(&exe));
        let b = frame(0x1300, &["via_two"], Some(&exe));
        let k = frame(0xffff_0000_0000_1000, &["do_syscall_64"], Some(&kernel));
        let mut builder = Builder::new(Some(Sampling::CpuNanos(10_101_010)));
        let labels = [Label::Str("comm", "leaf".into()), Label::Num("pid", 42)];
        builder.add(&[k.clone(), leaf.clone(), a], 300, &labels);
        builder.add(&[k, leaf, b], 700, &labels);
        let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let want = builder.finish(start, Duration::from_secs(2));
        let p = decode(&encode(&want));
        assert_eq!(p, want);

        // The string table: "" first, each string once.
        assert_eq!(p.string_table[0], "");
        let mut seen = std::collections::HashSet::new();
        assert!(
            p.string_table.iter().all(|x| seen.insert(x)),
            "{:?}",
            p.string_table
        );
        let types: Vec<(&str, &str)> = p
            .sample_type
            .iter()
            .map(|t| (s(&p, t.r#type), s(&p, t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        let pt = p.period_type.as_ref().unwrap();
        assert_eq!((s(&p, pt.r#type), p.period), ("cpu", 10_101_010));
        assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(p.duration_nanos, 2_000_000_000);

        // Two samples sharing the kernel and leaf locations; values count
        // and count x period.
        assert_eq!(p.sample.len(), 2);
        assert_eq!(p.sample[0].value, [300, 300 * 10_101_010]);
        assert_eq!(p.sample[1].value, [700, 700 * 10_101_010]);
        assert_eq!(p.sample[0].location_id[..2], p.sample[1].location_id[..2]);
        assert_eq!(p.location.len(), 4);
        let l = &p.sample[0].label;
        assert_eq!((s(&p, l[0].key), s(&p, l[0].str)), ("comm", "leaf"));
        assert_eq!((s(&p, l[1].key), l[1].num), ("pid", 42));

        // The leaf: one location, two lines, innermost first.
        let loc = &p.location[p.sample[0].location_id[1] as usize - 1];
        let names: Vec<&str> = loc
            .line
            .iter()
            .map(|l| s(&p, p.function[l.function_id as usize - 1].name))
            .collect();
        assert_eq!(names, ["inner", "tk_leaf"]);
        assert_eq!(loc.address, 0x1100);

        // Two mappings, with their files and build IDs, inlined frames said.
        assert_eq!(p.mapping.len(), 2);
        let m = &p.mapping[p.location[1].mapping_id as usize - 1];
        assert_eq!(
            (s(&p, m.filename), s(&p, m.build_id)),
            ("/bin/leaf", "abcd")
        );
        assert!(m.has_functions && m.has_inline_frames);
        let m = &p.mapping[p.location[0].mapping_id as usize - 1];
        assert_eq!(s(&p, m.filename), "[kernel.kallsyms]");
    }

    #[test]
    fn pprof_counts_only_without_sampling() {
        let mut b = Builder::new(None);
        b.add(&[frame(0, &["f"], None)], 5, &[]);
        let p = b.finish(UNIX_EPOCH, Duration::ZERO);
        assert_eq!(p.sample_type.len(), 1);
        assert_eq!(p.sample[0].value, [5]);
        assert!(p.period_type.is_none());
        assert_eq!(p.location[0].mapping_id, 0);
    }

    #[test]
    fn pprof_interval_files_are_numbered_before_the_extension() {
        let n = |p: &str, i| numbered(Path::new(p), i).display().to_string();
        assert_eq!(n("out.pb.gz", 1), "out.1.pb.gz");
        assert_eq!(n("/tmp/x/out.pb.gz", 12), "/tmp/x/out.12.pb.gz");
        assert_eq!(n("cpu.prof", 2), "cpu.2.prof");
        assert_eq!(n("cpu", 3), "cpu.3");
        assert_eq!(n(".pb.gz", 1), ".pb.1.gz");
        assert_eq!(n(".hidden", 1), ".hidden.1");
    }
}
