//! OpenSM 3.3.23 `partitions.conf`: an AST faithful to the file, a strict parser and
//! a canonical renderer.
//!
//! The parser accepts a subset of what OpenSM accepts and refuses, with line and
//! column, every input that OpenSM would silently read differently from how it looks:
//!
//! * membership and keyword words must be exact (`full`, `limited`, `both`, `ALL`, ...);
//!   OpenSM matches prefixes (`limi`, `A`) and treats unknown membership words as `limited`;
//! * P_Keys must be 0x0001..=0x7fff (OpenSM keeps the low 15 bits, so `0x8c0c` or
//!   `0x17fff` would land on another partition or on Default);
//! * numbers are hex with `0x` or decimal without a leading zero (OpenSM reads `010` as octal);
//! * a P_Key belongs to one name: statements that repeat a name (with its P_Key or
//!   none) are kept apart here, as OpenSM reads them, and merged by whoever needs the
//!   partition as a whole; one key under two names, or one name with two keys, is refused;
//! * an explicit P_Key may not equal one OpenSM generates for an earlier partition;
//! * a file with no partition is refused (OpenSM falls back to `Default=0x7fff : ALL=full`);
//! * the header `Name[=PKey][,flags] :` must be on one line, as OpenSM reads it;
//! * after `mgid=...` the rest of the line may hold only group flags (OpenSM drops
//!   anything else there without a word);
//! * lines longer than OpenSM's 4094-byte line buffer, NUL and CR characters are refused.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::types::{Guid, Membership, PKey, parse_number};

/// OpenSM's default multicast rate (10 Gb/s) when a partition gives none.
pub const DEFAULT_RATE: u8 = 3;
/// OpenSM's default multicast MTU (2048) when a partition gives none.
pub const DEFAULT_MTU: u8 = 4;
/// OpenSM keeps partition names in a 32-byte buffer.
pub const MAX_NAME_LEN: usize = 31;
/// OpenSM reads the file with `fgets` into a 4096-byte buffer, `sizeof - 1`: longer lines split.
pub const MAX_LINE_LEN: usize = 4093;
/// [`parse_all`] stops after this many faults.
pub const MAX_ERRORS: usize = 50;

/// A whole partitions.conf.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Conf {
    /// Partition statements in file order (order matters to OpenSM).
    pub partitions: Vec<Partition>,
}

/// One statement `Name[=PKey][,flags] : members ;`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// Partition name.
    pub name: String,
    /// Its P_Key; `None` lets OpenSM generate one (see [`Conf::effective_pkeys`]).
    pub pkey: Option<PKey>,
    /// Header flags.
    pub flags: Flags,
    /// Port specifiers in file order.
    pub members: Vec<Member>,
    /// `mgid=` lines in file order.
    pub mcast_groups: Vec<McastGroup>,
}

/// Declares a struct with the seven options of [`GroupOptions`] where `..GroupOptions`
/// stands (each option with the attributes written after it), and gives it `options()` and
/// `set_options()`. The options are one concept, written once here: partitions.conf's
/// header flags ([`Flags`]), its `mgid=` groups ([`McastGroup`]) and a plan's partitions
/// ([`crate::PlanPartition`], [`crate::DefaultPartition`]) all carry them under the same
/// names. A plan's tables keep them at their own level, where `#[serde(flatten)]` of one
/// struct would have to give up `deny_unknown_fields`; so the fields are stamped into each
/// struct instead.
macro_rules! with_group_options {
    (
        @struct
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$bm:meta])* pub $bf:ident : $bt:ty, )*
            ..GroupOptions $(#[$om:meta])*,
            $( $(#[$am:meta])* pub $af:ident : $at:ty, )*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $( $(#[$bm])* pub $bf: $bt, )*
            /// IBTA MTU code 1..=5 (`mtu=`; 4 is 2048).
            $(#[$om])*
            pub mtu: Option<u8>,
            /// IBTA rate code 2..=18 (`rate=`).
            $(#[$om])*
            pub rate: Option<u8>,
            /// Service level 0..=15 (`sl=`).
            $(#[$om])*
            pub sl: Option<u8>,
            /// Multicast scope 1..=15 (`scope=`).
            $(#[$om])*
            pub scope: Option<u8>,
            /// Q_Key of the multicast groups (`Q_Key=`).
            $(#[$om])*
            pub qkey: Option<u32>,
            /// Traffic class (`TClass=`).
            $(#[$om])*
            pub tclass: Option<u8>,
            /// Flow label 0..=0xfffff (`FlowLabel=`).
            $(#[$om])*
            pub flow_label: Option<u32>,
            $( $(#[$am])* pub $af: $at, )*
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $( $(#[$bm:meta])* pub $bf:ident : $bt:ty, )*
            ..GroupOptions $(#[$om:meta])*,
            $( $(#[$am:meta])* pub $af:ident : $at:ty, )*
        }
    ) => {
        with_group_options! {
            @struct
            $(#[$meta])*
            $vis struct $name {
                $( $(#[$bm])* pub $bf: $bt, )*
                ..GroupOptions $(#[$om])*,
                $( $(#[$am])* pub $af: $at, )*
            }
        }

        impl $name {
            /// Its [`GroupOptions`].
            pub(crate) fn options(&self) -> $crate::conf::GroupOptions {
                $crate::conf::GroupOptions {
                    mtu: self.mtu,
                    rate: self.rate,
                    sl: self.sl,
                    scope: self.scope,
                    qkey: self.qkey,
                    tclass: self.tclass,
                    flow_label: self.flow_label,
                }
            }

            /// Sets every one of its [`GroupOptions`].
            pub(crate) fn set_options(&mut self, o: $crate::conf::GroupOptions) {
                self.mtu = o.mtu;
                self.rate = o.rate;
                self.sl = o.sl;
                self.scope = o.scope;
                self.qkey = o.qkey;
                self.tclass = o.tclass;
                self.flow_label = o.flow_label;
            }
        }
    };
}
pub(crate) use with_group_options;

with_group_options! {
    @struct
    /// The seven options that partitions.conf's header flags, its `mgid=` groups and a
    /// plan's partitions all carry (see `with_group_options!`); copied between them through
    /// `options()` and `set_options()` rather than field by field.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub(crate) struct GroupOptions {
        ..GroupOptions,
    }
}

with_group_options! {
    /// Header flags of a partition. Values use IBTA encodings (`mtu=4` is 2048).
    #[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
    pub struct Flags {
        /// `indx0`: put the key at block 0, index 0.
        pub indx0: bool,
        /// `ipoib`: create the IPoIB broadcast group.
        pub ipoib: bool,
        ..GroupOptions,
        /// `defmember=`: membership of ports that name none (OpenSM's default: limited).
        pub defmember: Option<Membership>,
    }
}

/// Which ports a specifier names. `NONE` and an empty list name no ports.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selector {
    /// One port GUID.
    Guid(Guid),
    /// `ALL`: every end port.
    All,
    /// `ALL_CAS`.
    AllCas,
    /// `ALL_SWITCHES`.
    AllSwitches,
    /// `ALL_ROUTERS`.
    AllRouters,
    /// `SELF`: the SM's own port.
    SelfPort,
}

impl Selector {
    fn keyword(&self) -> Option<&'static str> {
        match self {
            Selector::Guid(_) => None,
            Selector::All => Some("ALL"),
            Selector::AllCas => Some("ALL_CAS"),
            Selector::AllSwitches => Some("ALL_SWITCHES"),
            Selector::AllRouters => Some("ALL_ROUTERS"),
            Selector::SelfPort => Some("SELF"),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::Guid(g) => write!(f, "{g}"),
            other => f.write_str(other.keyword().unwrap_or_default()),
        }
    }
}

/// A port specifier `<selector>[=full|limited|both]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Which ports.
    pub selector: Selector,
    /// Membership as written; `None` means the partition's `defmember` (else limited).
    pub membership: Option<Membership>,
}

/// A multicast GID (an IPv6-form address whose first byte is 0xff).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gid(pub Ipv6Addr);

impl Gid {
    /// True for IPoIB groups (signature 0x401b or 0x601b in bytes 2..4).
    pub fn is_ip(&self) -> bool {
        let o = self.0.octets();
        matches!((o[2], o[3]), (0x40, 0x1b) | (0x60, 0x1b))
    }

    /// The P_Key field of an IP group's MGID (bytes 4..6).
    pub fn ip_pkey_field(&self) -> u16 {
        let o = self.0.octets();
        u16::from_be_bytes([o[4], o[5]])
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for Gid {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let addr: Ipv6Addr = s
            .parse()
            .map_err(|_| format!("`{s}` is not a GID (IPv6 form, for example ff12:401b::1)"))?;
        if addr.octets()[0] != 0xff {
            return Err(format!(
                "`{s}` is not a multicast GID (the first byte must be 0xff)"
            ));
        }
        Ok(Gid(addr))
    }
}

impl Serialize for Gid {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Gid {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

with_group_options! {
    /// An `mgid=<gid>[,flags]` line: a multicast group OpenSM creates up front.
    /// Flags not given are inherited from the partition. In a plan: `[[partition.mcast]]`.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct McastGroup {
        /// The group's MGID.
        pub mgid: Gid,
        ..GroupOptions #[serde(default, skip_serializing_if = "Option::is_none")],
    }
}

impl McastGroup {
    /// A group with no flags of its own.
    pub fn new(mgid: Gid) -> Self {
        McastGroup {
            mgid,
            mtu: None,
            rate: None,
            sl: None,
            scope: None,
            qkey: None,
            tclass: None,
            flow_label: None,
        }
    }
}

/// A parse error, 1-based line and column (columns count characters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// What was wrong.
    pub message: String,
}

impl Conf {
    /// The P_Key OpenSM gives each partition, in order: the written one, 0x7fff for a
    /// `Default` without one, or one generated counting up from 0x0001 past keys in use
    /// by partitions defined before it (OpenSM's `generate_pkey`). A statement that
    /// repeats an earlier name without a key gets that partition's key, as OpenSM finds
    /// it by name. `None` when the generator runs out.
    pub fn effective_pkeys(&self) -> Vec<Option<PKey>> {
        let mut used: BTreeSet<u16> = BTreeSet::from([PKey::DEFAULT.base()]);
        let mut counter: u16 = 0;
        let mut out = Vec::with_capacity(self.partitions.len());
        let mut by_name: BTreeMap<&str, PKey> = BTreeMap::new();
        for p in &self.partitions {
            let key = match p.pkey {
                Some(k) => Some(k),
                None if p.name == "Default" => Some(PKey::DEFAULT),
                // A later statement of a name without a key joins that partition.
                None if by_name.contains_key(p.name.as_str()) => {
                    by_name.get(p.name.as_str()).copied()
                }
                None => {
                    let mut found = None;
                    while counter < 0x7ffe {
                        counter += 1;
                        if !used.contains(&counter) {
                            found = PKey::new(counter).ok();
                            break;
                        }
                    }
                    found
                }
            };
            if let Some(k) = key {
                used.insert(k.base());
                by_name.entry(&p.name).or_insert(k);
            }
            out.push(key);
        }
        out
    }
}

// ---------------------------------------------------------------- parser

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    line: usize,
    col: usize,
    /// Positions of the members of the statement being read.
    member_marks: Vec<(usize, usize)>,
    /// One span per statement kept in the config.
    spans: Vec<Span>,
}

/// Where a statement and its port specifiers are in the text (1-based line and column).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Span {
    /// Line of the statement's name.
    pub line: usize,
    /// Column of the statement's name.
    pub column: usize,
    /// (line, column) of each member, in the order of [`Partition::members`].
    pub members: Vec<(usize, usize)>,
}

type PResult<T> = Result<T, ParseError>;

#[derive(Clone, Copy)]
struct Mark {
    line: usize,
    col: usize,
}

fn is_delim(c: char) -> bool {
    c.is_whitespace() || matches!(c, '=' | ',' | ':' | ';' | '#')
}

impl<'a> Parser<'a> {
    fn mark(&self) -> Mark {
        Mark {
            line: self.line,
            col: self.col,
        }
    }

    fn err_at<T>(&self, m: Mark, message: impl Into<String>) -> PResult<T> {
        Err(ParseError {
            line: m.line,
            column: m.col,
            message: message.into(),
        })
    }

    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    /// Skips spaces, tabs and a comment, not the newline.
    fn skip_inline(&mut self) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => {
                    self.bump();
                }
                '#' => {
                    while let Some(c) = self.peek() {
                        if c == '\n' {
                            break;
                        }
                        self.bump();
                    }
                }
                _ => break,
            }
        }
    }

    /// Skips whitespace, comments and newlines.
    fn skip_all(&mut self) {
        loop {
            self.skip_inline();
            if self.peek() == Some('\n') {
                self.bump();
            } else {
                break;
            }
        }
    }

    fn word(&mut self) -> (Mark, &'a str) {
        let m = self.mark();
        let start = self.pos;
        while let Some(c) = self.peek() {
            if is_delim(c) {
                break;
            }
            self.bump();
        }
        (m, &self.text[start..self.pos])
    }

    fn value_word(&mut self, what: &str) -> PResult<(Mark, &'a str)> {
        self.skip_inline();
        let (m, w) = self.word();
        if w.is_empty() {
            return self.err_at(m, format!("expected {what}, found {}", self.found()));
        }
        Ok((m, w))
    }

    fn found(&self) -> String {
        match self.peek() {
            None => "end of file".into(),
            Some('\n') => "end of line".into(),
            Some(c) => {
                let rest = &self.text[self.pos..];
                let end = rest
                    .char_indices()
                    .skip(1)
                    .find(|&(_, ch)| is_delim(ch))
                    .map_or(rest.len(), |(i, _)| i);
                if is_delim(c) {
                    format!("`{c}`")
                } else {
                    format!("`{}`", &rest[..end])
                }
            }
        }
    }

    fn expect_eq(&mut self, after: &str) -> PResult<()> {
        self.skip_inline();
        if self.peek() == Some('=') {
            self.bump();
            Ok(())
        } else {
            let m = self.mark();
            self.err_at(
                m,
                format!("expected `=` after `{after}`, found {}", self.found()),
            )
        }
    }

    fn number(&mut self, what: &str, max: u64, min: u64) -> PResult<u64> {
        let (m, w) = self.value_word(what)?;
        let v = parse_number(w)
            .or_else(|r| self.err_at(m, format!("expected {what}, found `{w}`: {r}")))?;
        if v < min || v > max {
            return self.err_at(m, format!("{what} must be {min}..={max}, found `{w}`"));
        }
        Ok(v)
    }

    /// Skips to just after the next `;` (or the end): where a statement that failed
    /// to parse is left behind so that the next one can be read.
    fn recover(&mut self) {
        while let Some(c) = self.peek() {
            self.bump();
            if c == ';' {
                break;
            }
        }
    }

    /// Parses every statement, going on after a fault (from the next `;`), and returns
    /// the config with every fault found, up to [`MAX_ERRORS`].
    fn parse_file(&mut self) -> (Conf, Vec<ParseError>) {
        let mut errs: Vec<ParseError> = Vec::new();
        if let Err(e) = self.check_chars() {
            return (Conf::default(), vec![e]);
        }
        let mut conf = Conf::default();
        // Name -> (line of its first statement, its written P_Key if any).
        let mut names: BTreeMap<String, (usize, Option<PKey>)> = BTreeMap::new();
        let mut keys: BTreeMap<u16, (usize, String)> = BTreeMap::new();
        let mut global_mgids: BTreeMap<Gid, String> = BTreeMap::new();
        let mut lines: Vec<usize> = Vec::new();
        loop {
            self.skip_all();
            if self.peek().is_none() || errs.len() >= MAX_ERRORS {
                break;
            }
            let start = self.mark();
            let (p, key_mark) = match self.statement() {
                Ok(x) => x,
                Err(e) => {
                    errs.push(e);
                    self.recover();
                    continue;
                }
            };
            if let Some(&(line, first_key)) = names.get(&p.name) {
                // OpenSM merges a statement that repeats a name into the partition of
                // that name when it gives no P_Key or the same one.
                if let (Some(a), Some(b)) = (first_key, p.pkey)
                    && a != b
                {
                    errs.push(ParseError {
                        line: key_mark.line,
                        column: key_mark.col,
                        message: format!(
                            "partition name `{}` is already used on line {line} with P_Key {a}; OpenSM would make two partitions of one name",
                            p.name
                        ),
                    });
                    continue;
                }
                if first_key.is_none()
                    && let Some(b) = p.pkey
                {
                    // The first statement's key was generated; the later explicit one is
                    // checked against it once all keys are known (below).
                    names.insert(p.name.clone(), (line, Some(b)));
                }
            } else {
                names.insert(p.name.clone(), (start.line, p.pkey));
            }
            if let Some(k) = p.pkey {
                match keys.get(&k.base()) {
                    Some((line, name)) if *name != p.name => {
                        errs.push(ParseError {
                            line: key_mark.line,
                            column: key_mark.col,
                            message: format!(
                                "P_Key {k} is already used by partition `{name}` on line {line}; OpenSM would merge the two"
                            ),
                        });
                        continue;
                    }
                    Some(_) => {}
                    None => {
                        keys.insert(k.base(), (start.line, p.name.clone()));
                    }
                }
            }
            let mut bad_mgid = false;
            for g in &p.mcast_groups {
                if g.mgid.is_ip() {
                    continue;
                }
                if let Some(other) = global_mgids.get(&g.mgid) {
                    errs.push(ParseError {
                        line: start.line,
                        column: start.col,
                        message: format!(
                            "mgid {} is already defined in partition `{other}`; OpenSM creates it once",
                            g.mgid
                        ),
                    });
                    bad_mgid = true;
                }
            }
            if bad_mgid {
                continue;
            }
            for g in &p.mcast_groups {
                if !g.mgid.is_ip() {
                    global_mgids.insert(g.mgid, p.name.clone());
                }
            }
            lines.push(start.line);
            self.spans.push(Span {
                line: start.line,
                column: start.col,
                members: std::mem::take(&mut self.member_marks),
            });
            conf.partitions.push(p);
        }
        if conf.partitions.is_empty() && errs.is_empty() {
            let m = self.mark();
            errs.push(ParseError {
                line: m.line,
                column: m.col,
                message: "no partition in the file; OpenSM would fall back to `Default=0x7fff : ALL=full`".into(),
            });
        }
        // Keys: generated ones that collide with explicit ones, and a name whose
        // statements end up with two keys.
        let eff = conf.effective_pkeys();
        let mut seen: BTreeMap<u16, &str> = BTreeMap::new();
        let mut by_name: BTreeMap<&str, PKey> = BTreeMap::new();
        for ((p, k), line) in conf.partitions.iter().zip(&eff).zip(&lines) {
            if errs.len() >= MAX_ERRORS {
                break;
            }
            let at = |message: String| ParseError {
                line: *line,
                column: 1,
                message,
            };
            match k {
                None => errs.push(at(format!(
                    "OpenSM cannot generate a P_Key for partition `{}`",
                    p.name
                ))),
                Some(k) => {
                    if let Some(&first) = by_name.get(p.name.as_str()) {
                        if first != *k {
                            errs.push(at(format!(
                                "partition `{}` gets P_Key {k} here but {first} in its first statement; OpenSM would make two partitions of one name",
                                p.name
                            )));
                        }
                        continue;
                    }
                    by_name.insert(&p.name, *k);
                    if let Some(first) = seen.get(&k.base()) {
                        errs.push(at(format!(
                            "partition `{}` gets P_Key {k}, which OpenSM already generated for partition `{first}`; give every partition an explicit P_Key",
                            p.name
                        )));
                        continue;
                    }
                    seen.insert(k.base(), &p.name);
                }
            }
        }
        errs.truncate(MAX_ERRORS);
        (conf, errs)
    }

    fn check_chars(&self) -> PResult<()> {
        for (i, line) in self.text.split('\n').enumerate() {
            if line.len() > MAX_LINE_LEN {
                return Err(ParseError {
                    line: i + 1,
                    column: MAX_LINE_LEN + 1,
                    message: format!(
                        "line is {} bytes long; OpenSM splits lines over {MAX_LINE_LEN} bytes",
                        line.len()
                    ),
                });
            }
            for (col, c) in line.chars().enumerate() {
                let bad = match c {
                    '\0' => Some("a NUL character"),
                    '\r' => Some(
                        "a carriage return (CR); OpenSM reads it as part of the word; use LF line endings",
                    ),
                    c if c.is_control() && c != '\t' => Some("a control character"),
                    _ => None,
                };
                if let Some(what) = bad {
                    return Err(ParseError {
                        line: i + 1,
                        column: col + 1,
                        message: format!("unexpected {what}"),
                    });
                }
            }
        }
        Ok(())
    }

    fn statement(&mut self) -> PResult<(Partition, Mark)> {
        self.member_marks.clear();
        // Header: on one line, up to ':'.
        let (nm, name) = self.word();
        if name.is_empty() {
            return self.err_at(
                nm,
                format!("expected a partition name, found {}", self.found()),
            );
        }
        validate_name(name).or_else(|e| self.err_at(nm, e.to_string()))?;
        let mut key_mark = nm;
        let mut pkey = None;
        self.skip_inline();
        if self.peek() == Some('=') {
            self.bump();
            let (m, w) = self.value_word("a P_Key")?;
            key_mark = m;
            let v = parse_number(w)
                .or_else(|r| self.err_at(m, format!("expected a P_Key, found `{w}`: {r}")))?;
            if v > 0xffff {
                return self.err_at(m, format!("P_Key `{w}` is more than 16 bits"));
            }
            // Checked just above: v fits in 16 bits.
            let k = PKey::new(v as u16).or_else(|e| self.err_at(m, e.to_string()))?;
            if k.is_default() && name != "Default" {
                return self.err_at(
                    m,
                    format!("P_Key 0x7fff belongs to the Default partition; `{name}` would be merged into it"),
                );
            }
            pkey = Some(k);
        }
        if name == "Default" && pkey.is_some_and(|k| !k.is_default()) {
            return self.err_at(key_mark, "the Default partition's P_Key is 0x7fff");
        }
        let mut flags = Flags::default();
        let mut seen_flags: BTreeSet<&str> = BTreeSet::new();
        loop {
            self.skip_inline();
            match self.peek() {
                Some(',') => {
                    self.bump();
                    self.skip_inline();
                    let (m, f) = self.word();
                    if f.is_empty() {
                        return self.err_at(
                            m,
                            format!("expected a partition flag, found {}", self.found()),
                        );
                    }
                    if !seen_flags.insert(f) {
                        return self.err_at(m, format!("flag `{f}` is given twice"));
                    }
                    self.header_flag(m, f, &mut flags)?;
                }
                Some(':') => {
                    self.bump();
                    break;
                }
                Some('\n') | None => {
                    let m = self.mark();
                    return self.err_at(
                        m,
                        format!(
                            "expected `:` after the header of partition `{name}` (OpenSM needs the header and `:` on one line), found {}",
                            self.found()
                        ),
                    );
                }
                _ => {
                    let m = self.mark();
                    return self.err_at(
                        m,
                        format!(
                            "expected `,` or `:` in the header of partition `{name}`, found {}",
                            self.found()
                        ),
                    );
                }
            }
        }
        let mut part = Partition {
            name: name.to_string(),
            pkey,
            flags,
            members: Vec::new(),
            mcast_groups: Vec::new(),
        };
        self.member_list(&mut part, nm)?;
        Ok((part, key_mark))
    }

    fn header_flag(&mut self, m: Mark, f: &str, flags: &mut Flags) -> PResult<()> {
        match f {
            "indx0" => flags.indx0 = true,
            "ipoib" => flags.ipoib = true,
            "defmember" => {
                self.expect_eq(f)?;
                let (vm, w) = self.value_word("`full`, `limited` or `both`")?;
                flags.defmember = Some(self.membership(vm, w)?);
            }
            _ => {
                let mut g = McastGroup::new(Gid(Ipv6Addr::UNSPECIFIED));
                if !self.group_flag(m, f, &mut g)? {
                    return self.err_at(
                        m,
                        format!(
                            "unknown partition flag `{f}` (known: indx0, ipoib, mtu, rate, sl, scope, Q_Key, TClass, FlowLabel, defmember)"
                        ),
                    );
                }
                flags.rate = flags.rate.or(g.rate);
                flags.mtu = flags.mtu.or(g.mtu);
                flags.sl = flags.sl.or(g.sl);
                flags.scope = flags.scope.or(g.scope);
                flags.qkey = flags.qkey.or(g.qkey);
                flags.tclass = flags.tclass.or(g.tclass);
                flags.flow_label = flags.flow_label.or(g.flow_label);
            }
        }
        Ok(())
    }

    /// Parses `=value` of a group flag into `g`; false when `f` is no group flag.
    fn group_flag(&mut self, _m: Mark, f: &str, g: &mut McastGroup) -> PResult<bool> {
        let (what, min, max) = match f {
            "mtu" => ("an MTU code (1=256 .. 5=4096)", 1, 5),
            "rate" => ("a rate code", 2, 18),
            "sl" => ("a service level", 0, 15),
            "scope" => ("a multicast scope", 1, 15),
            "Q_Key" => ("a Q_Key", 0, u64::from(u32::MAX)),
            "TClass" => ("a traffic class", 0, 255),
            "FlowLabel" => ("a flow label", 0, 0xfffff),
            _ => return Ok(false),
        };
        self.expect_eq(f)?;
        let v = self.number(what, max, min)?;
        // Each value was range-checked against its field's width just above.
        match f {
            "mtu" => g.mtu = Some(v as u8),
            "rate" => g.rate = Some(v as u8),
            "sl" => g.sl = Some(v as u8),
            "scope" => g.scope = Some(v as u8),
            "Q_Key" => g.qkey = Some(v as u32),
            "TClass" => g.tclass = Some(v as u8),
            _ => g.flow_label = Some(v as u32),
        }
        Ok(true)
    }

    fn membership(&self, m: Mark, w: &str) -> PResult<Membership> {
        w.parse::<Membership>().or_else(|_| {
            self.err_at(
                m,
                format!(
                    "unknown membership `{w}`: expected exactly `full`, `limited` or `both` (OpenSM would take it as `limited`)"
                ),
            )
        })
    }

    fn member_list(&mut self, part: &mut Partition, start: Mark) -> PResult<()> {
        let mut need_sep = false;
        let mut after_comma = true; // `:` counts as a separator
        let mut none_at: Option<Mark> = None;
        let mut selectors: BTreeSet<Selector> = BTreeSet::new();
        loop {
            self.skip_inline();
            let m = self.mark();
            match self.peek() {
                None => {
                    return self.err_at(
                        m,
                        format!(
                            "missing `;` at the end of partition `{}` (line {})",
                            part.name, start.line
                        ),
                    );
                }
                Some(';') => {
                    // OpenSM 3.3.23 refuses a `;` with nothing but blanks before it on its
                    // line (or since the previous `;` there): "no partition definition
                    // found", and then it opens the whole fabric. Seen with the real
                    // OpenSM; see the test `a_lone_semicolon_is_refused`.
                    let line_start = self.text[..self.pos].rfind('\n').map_or(0, |i| i + 1);
                    let before = &self.text[line_start..self.pos];
                    let segment = &before[before.rfind(';').map_or(0, |i| i + 1)..];
                    if segment.trim().is_empty() {
                        return self.err_at(
                            m,
                            format!(
                                "`;` alone on its line: OpenSM rejects it; end partition `{}` on the line of its last member",
                                part.name
                            ),
                        );
                    }
                    self.bump();
                    break;
                }
                Some('\n') => {
                    self.bump();
                    need_sep = false;
                    after_comma = false;
                }
                Some(',') => {
                    if !need_sep && after_comma {
                        return self.err_at(m, "expected a port specifier before `,`");
                    }
                    self.bump();
                    need_sep = false;
                    after_comma = true;
                }
                Some(_) => {
                    if need_sep {
                        return self
                            .err_at(m, format!("expected `,` or `;`, found {}", self.found()));
                    }
                    let (wm, w) = self.word();
                    if w.is_empty() {
                        return self.err_at(
                            wm,
                            format!("expected a port specifier, found {}", self.found()),
                        );
                    }
                    if w == "mgid" {
                        let g = self.mgid_entry(wm, part)?;
                        part.mcast_groups.push(g);
                    } else if w == "NONE" {
                        none_at = Some(wm);
                    } else {
                        let selector = match w {
                            "ALL" => Selector::All,
                            "ALL_CAS" => Selector::AllCas,
                            "ALL_SWITCHES" => Selector::AllSwitches,
                            "ALL_ROUTERS" => Selector::AllRouters,
                            "SELF" => Selector::SelfPort,
                            _ => {
                                let v = parse_number(w).or_else(|_| {
                                    self.err_at(wm, format!("expected a port GUID, found `{w}`"))
                                })?;
                                if v == 0 {
                                    return self.err_at(wm, "port GUID 0 is not valid");
                                }
                                Selector::Guid(Guid(v))
                            }
                        };
                        self.skip_inline();
                        let mut membership = None;
                        if self.peek() == Some('=') {
                            self.bump();
                            let (vm, v) = self.value_word("`full`, `limited` or `both`")?;
                            membership = Some(self.membership(vm, v)?);
                        }
                        if !selectors.insert(selector.clone()) {
                            return self.err_at(
                                wm,
                                format!("`{w}` is listed twice in partition `{}`", part.name),
                            );
                        }
                        self.member_marks.push((wm.line, wm.col));
                        part.members.push(Member {
                            selector,
                            membership,
                        });
                    }
                    need_sep = true;
                    after_comma = false;
                }
            }
        }
        // `NONE` may close a list of multicast groups (OpenSM needs a port entry or
        // `NONE` after an mgid line), but not sit beside ports.
        if let Some(m) = none_at
            && !part.members.is_empty()
        {
            return self.err_at(m, "`NONE` means no ports; it cannot stand beside ports");
        }
        Ok(())
    }

    fn mgid_entry(&mut self, wm: Mark, part: &Partition) -> PResult<McastGroup> {
        self.expect_eq("mgid")?;
        self.skip_inline();
        let m = self.mark();
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_whitespace() || matches!(c, ',' | ';' | '#') {
                break;
            }
            self.bump();
        }
        let text = &self.text[start..self.pos];
        let mgid: Gid = text.parse().or_else(|e: String| self.err_at(m, e))?;
        let mut g = McastGroup::new(mgid);
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        loop {
            self.skip_inline();
            if self.peek() != Some(',') {
                break;
            }
            self.bump();
            self.skip_inline();
            let (fm, f) = self.word();
            if f.is_empty() {
                return self.err_at(
                    fm,
                    format!(
                        "expected a multicast group flag after `,` (OpenSM reads the rest of an mgid line as group flags), found {}",
                        self.found()
                    ),
                );
            }
            if !seen.insert(f) {
                return self.err_at(fm, format!("flag `{f}` is given twice"));
            }
            if !self.group_flag(fm, f, &mut g)? {
                return self.err_at(
                    fm,
                    format!(
                        "`{f}` is not a multicast group flag; OpenSM reads the rest of an mgid line as group flags and would drop it: put it on its own line"
                    ),
                );
            }
        }
        match self.peek() {
            None | Some('\n') | Some(';') => {}
            _ => {
                let m = self.mark();
                return self.err_at(
                    m,
                    format!("expected the end of the mgid line, found {}", self.found()),
                );
            }
        }
        if part.mcast_groups.iter().any(|o| o.mgid == g.mgid) {
            return self.err_at(
                m,
                format!(
                    "mgid {} is given twice in partition `{}`",
                    g.mgid, part.name
                ),
            );
        }
        if g.mgid.is_ip() {
            if g.mgid.ip_pkey_field() != 0 {
                return self.err_at(
                    m,
                    "write 0000 in the P_Key field of an IP multicast group (bytes 4..6); OpenSM fills in the partition's key",
                );
            }
            let prate = part.flags.rate.unwrap_or(DEFAULT_RATE);
            let pmtu = part.flags.mtu.unwrap_or(DEFAULT_MTU);
            if g.rate.is_some_and(|r| r != prate) || g.mtu.is_some_and(|x| x != pmtu) {
                return self.err_at(
                    wm,
                    format!(
                        "IP multicast group {} must have the rate ({prate}) and mtu ({pmtu}) of partition `{}`; OpenSM would not create it",
                        g.mgid, part.name
                    ),
                );
            }
        }
        if self.peek() == Some(';') {
            // Checked with the real OpenSM 3.3.23: `mgid=<gid> ;` is "no partition
            // definition found" there (and it then opens the whole fabric).
            let m = self.mark();
            return self.err_at(
                m,
                format!(
                    "`;` right after an mgid entry: OpenSM rejects it; end partition `{}` on a port line or with `NONE ;`",
                    part.name
                ),
            );
        }
        Ok(g)
    }
}

/// Why a partition name is refused; names the name and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The first character is not a letter or `_`.
    #[error(
        "partition name `{0}` must start with a letter or `_` (OpenSM reads a leading digit as a P_Key)"
    )]
    BadStart(String),
    /// A character other than letters, digits, `_`, `-` and `.`.
    #[error("partition name `{0}` may hold only letters, digits, `_`, `-` and `.`")]
    BadChar(String),
    /// Longer than [`MAX_NAME_LEN`].
    #[error("partition name `{0}` is longer than {max} characters (OpenSM's limit)", max = MAX_NAME_LEN)]
    TooLong(String),
}

/// Checks a partition name against the rules of [`parse`].
pub fn validate_name(name: &str) -> Result<(), NameError> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok {
        return Err(NameError::BadStart(name.to_string()));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(NameError::BadChar(name.to_string()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong(name.to_string()));
    }
    Ok(())
}

/// Parses partitions.conf text strictly (see the module documentation); the first
/// fault, if any. [`parse_all`] reports every fault.
pub fn parse(text: &str) -> Result<Conf, ParseError> {
    parse_all(text).map_err(|mut e| e.swap_remove(0))
}

/// Like [`parse`], but reads on after a fault (from the next `;`) and returns every
/// fault found, in file order, up to [`MAX_ERRORS`]. Never an empty list on `Err`.
pub fn parse_all(text: &str) -> Result<Conf, Vec<ParseError>> {
    parse_spanned(text).map(|(c, _)| c)
}

/// Like [`parse_all`], with where each statement and member is, one [`Span`] per
/// partition statement.
pub fn parse_spanned(text: &str) -> Result<(Conf, Vec<Span>), Vec<ParseError>> {
    let mut p = Parser {
        text,
        pos: 0,
        line: 1,
        col: 1,
        member_marks: Vec::new(),
        spans: Vec::new(),
    };
    let (conf, mut errs) = p.parse_file();
    if errs.is_empty() {
        Ok((conf, p.spans))
    } else {
        errs.sort_by_key(|e| (e.line, e.column));
        Err(errs)
    }
}

// ---------------------------------------------------------------- renderer

/// Members written on the header line when there are at most this many (and no mgid).
const INLINE_MEMBERS: usize = 4;

/// Renders canonically: a comment header, then one statement per partition in order,
/// header flags in a fixed order, long member lists one per line.
pub fn render(conf: &Conf) -> String {
    let mut out = String::with_capacity(64 + conf.partitions.len() * 128);
    out.push_str("# partitions.conf for OpenSM 3.3.23, rendered by weft; edits are overwritten.\n");
    for p in &conf.partitions {
        render_partition(&mut out, p);
    }
    out
}

fn render_group_flags(out: &mut String, g: &McastGroup) {
    use std::fmt::Write;
    // Writing to a String cannot fail.
    if let Some(v) = g.mtu {
        let _ = write!(out, ",mtu={v}");
    }
    if let Some(v) = g.rate {
        let _ = write!(out, ",rate={v}");
    }
    if let Some(v) = g.sl {
        let _ = write!(out, ",sl={v}");
    }
    if let Some(v) = g.scope {
        let _ = write!(out, ",scope={v}");
    }
    if let Some(v) = g.qkey {
        let _ = write!(out, ",Q_Key=0x{v:08x}");
    }
    if let Some(v) = g.tclass {
        let _ = write!(out, ",TClass={v}");
    }
    if let Some(v) = g.flow_label {
        let _ = write!(out, ",FlowLabel=0x{v:05x}");
    }
}

fn render_partition(out: &mut String, p: &Partition) {
    use std::fmt::Write;
    out.push_str(&p.name);
    if let Some(k) = p.pkey {
        let _ = write!(out, "={k}");
    }
    let f = &p.flags;
    if f.indx0 {
        out.push_str(",indx0");
    }
    if f.ipoib {
        out.push_str(",ipoib");
    }
    let mut as_group = McastGroup::new(Gid(Ipv6Addr::UNSPECIFIED));
    as_group.set_options(f.options());
    render_group_flags(out, &as_group);
    if let Some(m) = f.defmember {
        let _ = write!(out, ",defmember={m}");
    }
    out.push_str(" :");
    let member = |out: &mut String, m: &Member| {
        let _ = write!(out, "{}", m.selector);
        if let Some(ms) = m.membership {
            let _ = write!(out, "={ms}");
        }
    };
    if p.members.is_empty() && p.mcast_groups.is_empty() {
        out.push_str(" NONE ;\n");
        return;
    }
    if p.mcast_groups.is_empty() && p.members.len() <= INLINE_MEMBERS {
        for (i, m) in p.members.iter().enumerate() {
            out.push_str(if i == 0 { " " } else { ", " });
            member(out, m);
        }
        out.push_str(" ;\n");
        return;
    }
    // One entry a line; the statement ends on the line of its last port, because
    // OpenSM refuses a `;` alone on a line
    out.push('\n');
    let entries = p.mcast_groups.len() + p.members.len();
    // and one right after an mgid entry: a partition of groups only ends with `NONE ;`.
    for g in &p.mcast_groups {
        let _ = write!(out, "    mgid={}", g.mgid);
        render_group_flags(out, g);
        out.push('\n');
    }
    if p.members.is_empty() {
        out.push_str("    NONE ;\n");
    }
    for (i, m) in p.members.iter().enumerate() {
        out.push_str("    ");
        member(out, m);
        out.push_str(if p.mcast_groups.len() + i + 1 == entries {
            " ;\n"
        } else {
            ",\n"
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_pkeys_follow_opensm_generation() {
        let c = parse("a : ALL ;\nb=0x0002 : ALL ;\nc : ALL ;\nDefault : SELF=full ;").unwrap();
        let keys: Vec<u16> = c
            .effective_pkeys()
            .into_iter()
            .flatten()
            .map(PKey::base)
            .collect();
        assert_eq!(keys, vec![1, 2, 3, 0x7fff]);
    }

    #[test]
    fn gid_checks() {
        assert!("ff12:401b::1".parse::<Gid>().unwrap().is_ip());
        assert!(!"ff12::1".parse::<Gid>().unwrap().is_ip());
        assert!("fe80::1".parse::<Gid>().is_err());
        assert_eq!(
            "ff12:401b:8a0a::1".parse::<Gid>().unwrap().ip_pkey_field(),
            0x8a0a
        );
    }

    #[test]
    fn render_is_canonical() {
        let c = parse("t = 0x10 , ipoib , defmember = full : ALL , SELF = full ;").unwrap();
        assert_eq!(
            render(&c).lines().nth(1),
            Some("t=0x0010,ipoib,defmember=full : ALL, SELF=full ;")
        );
        let c = parse("e=0x11 : ;").unwrap();
        assert_eq!(render(&c).lines().nth(1), Some("e=0x0011 : NONE ;"));
    }
}
