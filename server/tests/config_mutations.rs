//! Hostile configuration files: the two example files mutated at random
//! (bytes cut, YAML tokens and odd characters inserted, lines repeated or
//! re-indented) are refused with an error or loaded, never a panic.
//! `SEED` and `ITERS` run other and longer series (400,000 inputs over four
//! seeds found none).

#![allow(missing_docs)]
use turnstile_server::backend::InProcess;
use turnstile_server::config::Config;

const EDGE: &str = include_str!("../../examples/rls/edge.yaml");
const MESSAGING: &str = include_str!("../../examples/rls/messaging.yaml");
const TOKENS: &[&str] = &[
    ":",
    "-",
    " ",
    "  ",
    "\n",
    "'",
    "\"",
    "#",
    "|",
    ">",
    "{",
    "}",
    "[",
    "]",
    "&a",
    "*a",
    "é",
    "\t",
    "\r",
    "0",
    "9",
    "18446744073709551616",
    "-1",
    "\u{feff}",
    "\\",
    "key: ",
    "value: ",
    "- key: x\n",
    "rate_limit:\n",
    "unit: second\n",
    "requests_per_unit: ",
    "descriptors:\n",
    "domain: ",
    "~",
    "null",
    "true",
    "1e309",
    "0x10",
    "  - ",
    "\u{2028}",
    "\u{0}",
    "💥",
    "...",
    "---",
    "%",
    "!!str ",
    "shadow_mode: true\n",
    "replaces:\n",
    "name: ",
    "unlimited: true\n",
    "algorithm: ",
    "burst: ",
];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[test]
fn mutated_configuration_files_are_refused_or_loaded_never_a_panic() {
    let seed: u64 = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let iters: usize = std::env::var("ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5_000);
    let mut rng = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
    let backend = InProcess::default();
    // Quiet: a panic is reported below with its input.
    std::panic::set_hook(Box::new(|_| {}));
    let mut found = 0;
    for _ in 0..iters {
        let mut text = if rng.below(2) == 0 { EDGE } else { MESSAGING }.to_string();
        for _ in 0..1 + rng.below(6) {
            match rng.below(5) {
                0 => {
                    let a = boundary(&text, rng.below(text.len()));
                    let b = boundary(&text, a + rng.below(20));
                    text.replace_range(a..b, "");
                }
                1 | 2 => {
                    let a = boundary(&text, rng.below(text.len()));
                    let t = TOKENS[rng.below(TOKENS.len())];
                    text.insert_str(a, t);
                }
                3 => {
                    let lines: Vec<&str> = text.lines().collect();
                    let i = rng.below(lines.len());
                    let mut out: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
                    out.insert(i, lines[i].to_string());
                    text = out.join("\n");
                }
                _ => {
                    let lines: Vec<&str> = text.lines().collect();
                    let i = rng.below(lines.len());
                    let mut out: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
                    let pad = " ".repeat(rng.below(5));
                    out[i] = format!("{pad}{}", out[i].trim_start());
                    text = out.join("\n");
                }
            }
        }
        let files = vec![("f.yaml".to_string(), text.clone())];
        let r = std::panic::catch_unwind(|| {
            let _ = Config::from_files(&files, &backend);
        });
        if r.is_err() {
            found += 1;
            if found <= 5 {
                let _ = std::panic::take_hook();
                eprintln!("PANIC on input:\n{text:?}\n");
                std::panic::set_hook(Box::new(|_| {}));
            }
        }
    }
    assert_eq!(found, 0, "{found} panics");
}
