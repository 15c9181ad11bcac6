//! Prompt text: natural-looking sentences from the word list in this crate (or from a text
//! file the user names), cut to a token budget, each request opened by a unique tag so no
//! server cache can answer it.

use std::path::Path;

use rand_xoshiro::SplitMix64;
use rand_xoshiro::rand_core::{Rng as _, SeedableRng};

use crate::LlmError;
use crate::count::Counter;

/// The default word list (`data/words.txt`): common English words.
const WORDS: &str = include_str!("../data/words.txt");

/// Where prompt words come from.
#[derive(Debug, Clone)]
pub struct Corpus {
    words: Vec<String>,
    /// Words of a user's file are taken in order (running text); the word list is sampled.
    running: bool,
    /// Describes the source for the report.
    pub source: String,
}

/// A small deterministic generator (SplitMix64, rand_xoshiro's): the same seed gives the
/// same prompts.
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64::seed_from_u64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

impl Corpus {
    /// The built-in word list.
    pub fn words() -> Corpus {
        Corpus {
            words: WORDS.split_whitespace().map(str::to_string).collect(),
            running: false,
            source: "built-in word list".into(),
        }
    }

    /// Running text from a file; it must hold at least 100 words.
    pub fn file(path: &Path) -> Result<Corpus, LlmError> {
        let text = std::fs::read_to_string(path).map_err(|e| LlmError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let words: Vec<String> = text.split_whitespace().map(str::to_string).collect();
        if words.len() < 100 {
            return Err(LlmError::Input(format!(
                "--text {}: {} words; at least 100 are needed to build prompts",
                path.display(),
                words.len()
            )));
        }
        Ok(Corpus {
            words,
            running: true,
            source: format!("file {}", path.display()),
        })
    }

    /// About `n` words of text.
    pub fn text(&self, rng: &mut Rng, n: usize) -> String {
        let mut s = String::new();
        if self.running {
            let mut i = rng.below(self.words.len());
            for k in 0..n {
                if k > 0 {
                    s.push(' ');
                }
                s.push_str(&self.words[i]);
                i = (i + 1) % self.words.len();
            }
            return s;
        }
        let mut left = n;
        while left > 0 {
            let len = (6 + rng.below(10)).min(left);
            for k in 0..len {
                let w = &self.words[rng.below(self.words.len())];
                if k == 0 {
                    if !s.is_empty() {
                        s.push(' ');
                    }
                    let mut c = w.chars();
                    if let Some(f) = c.next() {
                        s.extend(f.to_uppercase());
                        s.push_str(c.as_str());
                    }
                } else {
                    s.push(if rng.below(12) == 0 { ',' } else { ' ' });
                    if s.ends_with(',') {
                        s.push(' ');
                    }
                    s.push_str(w);
                }
            }
            s.push('.');
            left -= len;
        }
        s
    }
}

/// A unique tag that opens a request's prompt (`Note 4f1c9a2e07.`), so that neither a prefix
/// cache nor a response cache can have seen it.
pub fn unique_tag(rng: &mut Rng) -> String {
    format!("Note {:010x}. ", rng.next_u64() & 0xff_ffff_ffff)
}

/// Builds text of a given token count: exactly with a local tokenizer, else from the measured
/// tokens per word.
#[derive(Debug, Clone)]
pub struct Builder {
    pub corpus: Corpus,
    /// Tokens per word of this corpus, from the warm-up (or the tokenizer).
    pub tokens_per_word: f64,
}

impl Builder {
    /// `tag` followed by text, about `tokens` tokens in all (exact when `counter` is given).
    pub fn build(
        &self,
        rng: &mut Rng,
        tag: &str,
        tokens: u64,
        counter: Option<&Counter>,
    ) -> Result<String, LlmError> {
        if tokens == 0 {
            return Ok(tag.trim_end().to_string());
        }
        let tpw = self.tokens_per_word.max(0.1);
        let mut words = ((tokens as f64 / tpw).ceil() as usize).max(1);
        let Some(c) = counter else {
            let tag_tokens = (tag.split_whitespace().count() as f64 * tpw * 2.0).round() as usize;
            words = ((tokens as f64 - tag_tokens as f64) / tpw).round().max(1.0) as usize;
            return Ok(format!("{tag}{}", self.corpus.text(rng, words)));
        };
        loop {
            let s = format!("{tag}{}", self.corpus.text(rng, words + words / 8 + 8));
            if let Some(cut) = c.cut(&s, tokens as usize)? {
                return Ok(cut);
            }
            words *= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_text_reads_like_sentences_and_is_deterministic() {
        let c = Corpus::words();
        let a = c.text(&mut Rng::new(7), 40);
        let b = c.text(&mut Rng::new(7), 40);
        assert_eq!(a, b);
        assert_eq!(a.split_whitespace().count(), 40, "{a}");
        assert!(a.ends_with('.'), "{a}");
        assert!(a.chars().next().is_some_and(|c| c.is_uppercase()), "{a}");
        assert_ne!(a, c.text(&mut Rng::new(8), 40));
    }

    #[test]
    fn tags_differ_from_request_to_request() {
        let mut r = Rng::new(1);
        let tags: std::collections::BTreeSet<String> =
            (0..1000).map(|_| unique_tag(&mut r)).collect();
        assert_eq!(tags.len(), 1000);
    }
}
