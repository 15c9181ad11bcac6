//! Server-sent events as OpenAI-compatible servers stream them, parsed without I/O: bytes in
//! through [`SseParser::push`], whole `data:` payloads out. A payload may be split across any
//! number of network reads, and one read may hold many payloads.

/// What one `data:` payload of a completion stream says.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Delta {
    /// Generated text in this chunk (`delta.content`, `delta.reasoning_content`,
    /// `delta.reasoning` or, on `/v1/completions`, `text`), concatenated.
    pub text: String,
    /// Token ids, when the server sends them (`token_ids` on the choice or the delta).
    pub token_ids: Option<Vec<u32>>,
    /// Tokens in this chunk as the server's `logprobs` list them (one entry per generated
    /// token: `logprobs.content` on chat, `logprobs.tokens` on completions), when it sends
    /// them (the request asked for `logprobs`).
    pub logprob_tokens: Option<u64>,
    /// The `usage` object, when this chunk carries one (with `stream_options.include_usage`,
    /// the last chunk before `[DONE]`).
    pub usage: Option<Usage>,
    /// `finish_reason`, when set.
    pub finish_reason: Option<String>,
    /// The chunk named a role and nothing else (`{"delta":{"role":"assistant"}}`).
    pub role_only: bool,
}

/// Token counts as the server reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `prompt_tokens_details.cached_tokens`, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
}

/// One event out of the stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Chunk(Box<Delta>),
    /// `data: [DONE]`.
    Done,
    /// The server put an error object in the stream (`{"error": ...}`), or a payload that is
    /// not a completion chunk at all.
    Error(String),
}

/// Splits a byte stream into events.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    pub fn new() -> SseParser {
        SseParser::default()
    }

    /// Feeds bytes; returns the events completed by them, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        // The common case, a read that holds whole events only, is parsed where it lies;
        // bytes are kept only when an event is still open at the end.
        if self.buf.is_empty() {
            let used = parse_events(bytes, &mut out);
            self.buf.extend_from_slice(&bytes[used..]);
        } else {
            self.buf.extend_from_slice(bytes);
            let used = parse_events(&self.buf, &mut out);
            self.buf.drain(..used);
        }
        out
    }

    /// Bytes received that do not yet end an event.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// Parses the whole events at the start of `b` into `out`; the bytes they took.
fn parse_events(b: &[u8], out: &mut Vec<Event>) -> usize {
    let mut used = 0;
    while let Some((end, sep)) = find_event_end(&b[used..]) {
        let block = &b[used..used + end];
        used += end + sep;
        let text = String::from_utf8_lossy(block);
        // One `data:` line (what servers send) is borrowed; several are joined with `\n`.
        let mut one: Option<&str> = None;
        let mut joined: Option<String> = None;
        for line in text.lines() {
            let Some(d) = line.strip_prefix("data:") else {
                continue;
            };
            let d = d.strip_prefix(' ').unwrap_or(d);
            if let Some(j) = joined.as_mut() {
                j.push('\n');
                j.push_str(d);
            } else if let Some(first) = one {
                joined = Some(format!("{first}\n{d}"));
            } else {
                one = Some(d);
            }
        }
        let data = joined.as_deref().or(one).unwrap_or("");
        if data.is_empty() {
            continue; // comments (": keep-alive") and event-only blocks
        }
        out.push(parse_payload(data.trim()));
    }
    used
}

fn find_event_end(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'\n' && b[i + 1] == b'\n' {
            return Some((i, 2));
        }
        if i + 3 < b.len() && &b[i..i + 4] == b"\r\n\r\n" {
            return Some((i, 4));
        }
        i += 1;
    }
    None
}

fn parse_payload(data: &str) -> Event {
    if data == "[DONE]" {
        return Event::Done;
    }
    let v: serde_json::Value = match serde_json::from_str(data) {
        Ok(v) => v,
        Err(e) => {
            return Event::Error(format!(
                "a stream payload is not JSON ({e}): {}",
                clip(data)
            ));
        }
    };
    if let Some(err) = v.get("error") {
        let msg = err
            .get("message")
            .and_then(|m| m.as_str())
            .map(str::to_string)
            .unwrap_or_else(|| err.to_string());
        return Event::Error(msg);
    }
    let Some(choices) = v.get("choices").and_then(|c| c.as_array()) else {
        return Event::Error(format!(
            "a stream payload has no `choices`, so it is not an OpenAI completion chunk: {}",
            clip(data)
        ));
    };
    let mut d = Delta::default();
    let mut saw_role = false;
    for ch in choices {
        let delta = ch.get("delta");
        let texts = [
            (delta, "content"),
            (delta, "reasoning_content"),
            (delta, "reasoning"),
            (Some(ch), "text"),
        ];
        for (src, key) in texts {
            if let Some(t) = src.and_then(|s| s.get(key)).and_then(|t| t.as_str()) {
                d.text.push_str(t);
            }
        }
        for src in [delta, Some(ch)].into_iter().flatten() {
            if let Some(ids) = src.get("token_ids").and_then(|t| t.as_array()) {
                let ids: Vec<u32> = ids
                    .iter()
                    .filter_map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
                    .collect();
                d.token_ids.get_or_insert_with(Vec::new).extend(ids);
            }
        }
        if let Some(lp) = ch.get("logprobs").filter(|l| !l.is_null()) {
            let list = lp
                .get("content")
                .and_then(|c| c.as_array())
                .or_else(|| lp.get("tokens").and_then(|t| t.as_array()));
            if let Some(list) = list {
                *d.logprob_tokens.get_or_insert(0) += list.len() as u64;
            }
        }
        if delta.and_then(|x| x.get("role")).is_some() {
            saw_role = true;
        }
        if let Some(f) = ch.get("finish_reason").and_then(|f| f.as_str()) {
            d.finish_reason = Some(f.to_string());
        }
    }
    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
        let n = |k: &str| u.get(k).and_then(|x| x.as_u64());
        if let (Some(p), Some(c)) = (n("prompt_tokens"), n("completion_tokens")) {
            d.usage = Some(Usage {
                prompt_tokens: p,
                completion_tokens: c,
                cached_tokens: u
                    .get("prompt_tokens_details")
                    .and_then(|x| x.get("cached_tokens"))
                    .and_then(|x| x.as_u64()),
            });
        }
    }
    d.role_only = saw_role
        && d.text.is_empty()
        && d.token_ids.is_none()
        && d.logprob_tokens.is_none_or(|n| n == 0);
    Event::Chunk(Box::new(d))
}

fn clip(s: &str) -> String {
    let mut t: String = s.chars().take(200).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(e: &Event) -> &str {
        match e {
            Event::Chunk(d) => &d.text,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn events_split_across_reads_come_out_whole_and_in_order() {
        let s = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n: ping\n\ndata: [DONE]\n\n";
        for cut in 1..s.len() {
            let mut p = SseParser::new();
            let mut ev = p.push(&s[..cut]);
            ev.extend(p.push(&s[cut..]));
            assert_eq!(ev.len(), 4, "cut at {cut}: {ev:?}");
            assert!(matches!(&ev[0], Event::Chunk(d) if d.role_only));
            assert_eq!(text(&ev[1]), "Hel");
            assert_eq!(text(&ev[2]), "lo");
            assert_eq!(ev[3], Event::Done);
            assert_eq!(p.pending(), 0);
        }
    }

    #[test]
    fn several_data_lines_are_one_payload_and_an_open_event_waits_for_its_end() {
        let mut p = SseParser::new();
        let ev =
            p.push(b"event: x\ndata: {\"choices\":\ndata: [{\"text\":\"a\"}]}\n\ndata: {\"choi");
        assert_eq!(ev.len(), 1);
        assert_eq!(text(&ev[0]), "a");
        assert_eq!(p.pending(), "data: {\"choi".len());
        let ev = p.push(b"ces\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n");
        assert_eq!(ev.len(), 2);
        assert_eq!(text(&ev[0]), "b");
        assert_eq!(ev[1], Event::Done);
        assert_eq!(p.pending(), 0);
    }

    #[test]
    fn usage_token_ids_reasoning_and_completions_text_are_read() {
        let mut p = SseParser::new();
        let ev = p.push(b"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"a\",\"token_ids\":[5,6]}}]}\n\ndata: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"length\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n");
        let Event::Chunk(a) = &ev[0] else { panic!() };
        assert_eq!(
            (a.text.as_str(), a.token_ids.clone()),
            ("a", Some(vec![5, 6]))
        );
        let Event::Chunk(b) = &ev[1] else { panic!() };
        assert_eq!(
            (b.text.as_str(), b.finish_reason.as_deref()),
            ("b", Some("length"))
        );
        let Event::Chunk(u) = &ev[2] else { panic!() };
        assert_eq!(
            u.usage,
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 2,
                cached_tokens: Some(4)
            })
        );
    }

    #[test]
    fn logprobs_entries_count_the_tokens_of_a_chunk() {
        let mut p = SseParser::new();
        let ev = p.push(b"data: {\"choices\":[{\"delta\":{\"content\":\" the cat\"},\"logprobs\":{\"content\":[{\"token\":\" the\",\"logprob\":-1.0},{\"token\":\" cat\",\"logprob\":-2.0}]}}]}\n\ndata: {\"choices\":[{\"text\":\" sat\",\"logprobs\":{\"tokens\":[\" sat\"],\"token_logprobs\":[-0.5]}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"logprobs\":null}]}\n\n");
        let n = |e: &Event| match e {
            Event::Chunk(d) => d.logprob_tokens,
            other => panic!("{other:?}"),
        };
        assert_eq!(n(&ev[0]), Some(2));
        assert_eq!(n(&ev[1]), Some(1));
        assert_eq!(n(&ev[2]), None);
    }

    #[test]
    fn an_error_object_or_a_foreign_payload_is_an_error_event() {
        let mut p = SseParser::new();
        let ev = p.push(b"data: {\"error\":{\"message\":\"model not found\"}}\n\ndata: {\"hello\":1}\n\ndata: nope\n\n");
        assert_eq!(ev[0], Event::Error("model not found".into()));
        assert!(matches!(&ev[1], Event::Error(m) if m.contains("no `choices`")));
        assert!(matches!(&ev[2], Event::Error(m) if m.contains("not JSON")));
    }
}
