//! Client operations on the wire: an incremental parser from bytes to [`ClientOp`].
//!
//! Owns framing only (nats-protocol.md "Framing"): where an op ends, its arguments, and the
//! two fatal limits. It knows nothing of subscriptions or permissions. "Not enough bytes yet"
//! is [`Parsed::NeedMore`], distinct from a malformed op, because one read may hold half a
//! verb or fifty ops. Every op is cut out of the read buffer as one frozen `Bytes`, and its
//! fields are slices of it, so a publish is never copied on the way in.

use bytes::{Buf, Bytes, BytesMut};

/// One operation a client sent.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ClientOp {
    /// `CONNECT <json>`; the JSON is decoded by the connection.
    Connect(Bytes),
    /// `PUB` or `HPUB`. `payload` holds headers and body; `header_len` is 0 for PUB.
    Publish(Publish),
    /// `SUB <subject> [queue] <sid>`.
    Subscribe {
        subject: Bytes,
        queue: Option<Bytes>,
        sid: Bytes,
    },
    /// `UNSUB <sid> [max]`. A max that is not a number means "now", as in nats-server.
    Unsubscribe {
        sid: Bytes,
        max: Option<u64>,
    },
    Ping,
    Pong,
    /// `INFO` and `+OK` from a client carry nothing we use; they are accepted and dropped.
    Ignored,
}

/// A publish: its whole frame, and where its fields lie in it. One reference to the read
/// buffer per message, not one per field: the count is an atomic add and subtract each, and
/// per-field slices were a sixth of the broker's CPU on 16-byte messages (perf, bench/bus.rs).
#[derive(Debug)]
pub(crate) struct Publish {
    frame: Bytes,
    subject: (usize, usize),
    reply: Option<(usize, usize)>,
    /// `Some(header bytes)` for HPUB.
    pub header_len: Option<usize>,
    payload: (usize, usize),
}

impl Publish {
    pub(crate) fn subject(&self) -> &[u8] {
        &self.frame[self.subject.0..self.subject.1]
    }

    pub(crate) fn reply(&self) -> Option<&[u8]> {
        self.reply.map(|(start, end)| &self.frame[start..end])
    }

    /// Headers and body.
    pub(crate) fn payload(&self) -> &[u8] {
        &self.frame[self.payload.0..self.payload.1]
    }

    /// A publish of these fields, framed as a client would send it (the tests' expectations).
    #[cfg(test)]
    pub(crate) fn of(
        subject: &[u8],
        reply: Option<&[u8]>,
        header_len: Option<usize>,
        payload: &[u8],
    ) -> Self {
        let mut frame = subject.to_vec();
        let reply = reply.map(|reply| {
            frame.extend_from_slice(reply);
            (subject.len(), frame.len())
        });
        let start = frame.len();
        frame.extend_from_slice(payload);
        Publish {
            subject: (0, subject.len()),
            reply,
            header_len,
            payload: (start, frame.len()),
            frame: Bytes::from(frame),
        }
    }
}

/// Two publishes are equal when their fields are, wherever they lie in their frames.
impl PartialEq for Publish {
    fn eq(&self, other: &Self) -> bool {
        self.subject() == other.subject()
            && self.reply() == other.reply()
            && self.header_len == other.header_len
            && self.payload() == other.payload()
    }
}

impl Eq for Publish {}

/// The outcome of one parse step.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    Op(ClientOp),
    /// The buffer holds only part of an op. `frame_len` is the whole op's size when the
    /// control line is complete (so the reader can reserve room for a large payload), else 0.
    NeedMore {
        frame_len: usize,
    },
}

/// Malformed input. Every variant closes the connection; `error_text` says whether an
/// `-ERR` goes first (nats-server closes silently on wrong argument counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProtocolError {
    UnknownOperation,
    ControlLineExceeded,
    PayloadTooLarge,
    BadArguments,
}

impl ProtocolError {
    /// The exact `-ERR` text nats-server 2.9.10 sends, if any.
    pub(crate) fn error_text(self) -> Option<&'static str> {
        match self {
            ProtocolError::UnknownOperation => Some("Unknown Protocol Operation"),
            ProtocolError::ControlLineExceeded => Some("maximum control line exceeded"),
            ProtocolError::PayloadTooLarge => Some("Maximum Payload Violation"),
            ProtocolError::BadArguments => None,
        }
    }
}

/// The parser's limits; it keeps no other state, so a partial op is simply re-parsed when
/// more bytes arrive (cheap: only the control line is scanned twice).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Parser {
    pub max_control_line: usize,
    pub max_payload: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Verb {
    Pub,
    Hpub,
    Sub,
    Unsub,
    Connect,
    Info,
    Ping,
    Pong,
    Ok,
    Err,
}

impl Parser {
    /// Takes one op off the front of `buffer`, or says more bytes are needed.
    pub(crate) fn parse(&self, buffer: &mut BytesMut) -> Result<Parsed, ProtocolError> {
        if buffer.is_empty() {
            return Ok(Parsed::NeedMore { frame_len: 0 });
        }
        let verb_len = buffer
            .iter()
            .position(|&byte| is_separator(byte) || byte == b'\r' || byte == b'\n');
        let verb = match (
            recognise_verb(&buffer[..verb_len.unwrap_or(buffer.len())]),
            verb_len,
        ) {
            (Recognised::Verb(verb), _) => verb,
            (Recognised::Partial, None) => return Ok(Parsed::NeedMore { frame_len: 0 }),
            (Recognised::Partial, Some(_)) | (Recognised::Unknown, _) => {
                return Err(ProtocolError::UnknownOperation)
            }
        };
        // PING, PONG and +OK match on their prefix, so their "verb" can be any length: the
        // limit counts from where the longest real verb would end, or a client could keep
        // us buffering `PINGxxxx…` without end.
        let Some(verb_len) = verb_len else {
            if buffer.len() > LONGEST_VERB + self.max_control_line + 1 {
                return Err(ProtocolError::ControlLineExceeded);
            }
            return Ok(Parsed::NeedMore { frame_len: 0 });
        };
        let Some(newline) = memchr::memchr(b'\n', buffer) else {
            if buffer.len() - verb_len.min(LONGEST_VERB) > self.max_control_line + 1 {
                return Err(ProtocolError::ControlLineExceeded);
            }
            return Ok(Parsed::NeedMore { frame_len: 0 });
        };
        let line_end = if newline > 0 && buffer[newline - 1] == b'\r' {
            newline - 1
        } else {
            newline
        };
        let line_end = line_end.max(verb_len);
        let args_start = verb_len
            + buffer[verb_len..line_end]
                .iter()
                .take_while(|&&byte| is_separator(byte))
                .count();
        if line_end - args_start > self.max_control_line {
            return Err(ProtocolError::ControlLineExceeded);
        }
        let line_len = newline + 1;
        match verb {
            Verb::Ping | Verb::Pong | Verb::Ok | Verb::Info => {
                buffer.advance(line_len);
                let op = match verb {
                    Verb::Ping => ClientOp::Ping,
                    Verb::Pong => ClientOp::Pong,
                    _ => ClientOp::Ignored,
                };
                Ok(Parsed::Op(op))
            }
            // `-ERR <text>` from a client is closed silently by nats-server; a bare `-ERR`
            // is an unknown operation (its state machine wants a separator).
            Verb::Err if is_separator(buffer[verb_len]) => Err(ProtocolError::BadArguments),
            Verb::Err => Err(ProtocolError::UnknownOperation),
            Verb::Connect => {
                let frame = buffer.split_to(line_len).freeze();
                Ok(Parsed::Op(ClientOp::Connect(
                    frame.slice(args_start..line_end),
                )))
            }
            Verb::Pub | Verb::Hpub => {
                self.parse_publish(buffer, verb == Verb::Hpub, args_start, line_end, line_len)
            }
            Verb::Sub | Verb::Unsub => {
                // These verbs need an argument separator, exactly like nats-server's state
                // machine: `UNSUB\r\n` is an unknown operation, `UNSUB \r\n` a bad argument.
                if !is_separator(buffer[verb_len]) {
                    return Err(ProtocolError::UnknownOperation);
                }
                let frame = buffer.split_to(line_len).freeze();
                let args = split_arguments(&frame, args_start, line_end);
                let arg = |index: usize| frame.slice(args[index].0..args[index].1);
                if verb == Verb::Sub {
                    match args.len() {
                        2 => Ok(Parsed::Op(ClientOp::Subscribe {
                            subject: arg(0),
                            queue: None,
                            sid: arg(1),
                        })),
                        3 => Ok(Parsed::Op(ClientOp::Subscribe {
                            subject: arg(0),
                            queue: Some(arg(1)),
                            sid: arg(2),
                        })),
                        _ => Err(ProtocolError::BadArguments),
                    }
                } else {
                    match args.len() {
                        1 => Ok(Parsed::Op(ClientOp::Unsubscribe {
                            sid: arg(0),
                            max: None,
                        })),
                        2 => Ok(Parsed::Op(ClientOp::Unsubscribe {
                            sid: arg(0),
                            max: parse_size(&arg(1)).map(|max| max as u64),
                        })),
                        _ => Err(ProtocolError::BadArguments),
                    }
                }
            }
        }
    }

    fn parse_publish(
        &self,
        buffer: &mut BytesMut,
        has_headers: bool,
        args_start: usize,
        line_end: usize,
        line_len: usize,
    ) -> Result<Parsed, ProtocolError> {
        let verb_len = if has_headers { 4 } else { 3 };
        if !is_separator(buffer[verb_len]) {
            return Err(ProtocolError::UnknownOperation);
        }
        let args = split_arguments(&buffer[..], args_start, line_end);
        let sizes = if has_headers { 2 } else { 1 };
        if args.len() < 1 + sizes || args.len() > 2 + sizes {
            return Err(ProtocolError::BadArguments);
        }
        let size_at = |index: usize| parse_size(&buffer[args[index].0..args[index].1]);
        let total_len = size_at(args.len() - 1).ok_or(ProtocolError::BadArguments)?;
        let header_len = if has_headers {
            let header_len = size_at(args.len() - 2).ok_or(ProtocolError::BadArguments)?;
            if header_len > total_len {
                return Err(ProtocolError::BadArguments);
            }
            Some(header_len)
        } else {
            None
        };
        // Checked before waiting for the payload, so a huge size never makes us buffer it.
        if total_len > self.max_payload {
            return Err(ProtocolError::PayloadTooLarge);
        }
        let frame_len = line_len + total_len + 2;
        if buffer.len() < frame_len {
            return Ok(Parsed::NeedMore { frame_len });
        }
        if &buffer[frame_len - 2..frame_len] != b"\r\n" {
            return Err(ProtocolError::UnknownOperation);
        }
        Ok(Parsed::Op(ClientOp::Publish(Publish {
            subject: args[0],
            reply: (args.len() == 2 + sizes).then(|| args[1]),
            header_len,
            payload: (line_len, line_len + total_len),
            frame: buffer.split_to(frame_len).freeze(),
        })))
    }
}

/// `CONNECT`, the longest verb.
const LONGEST_VERB: usize = 7;

enum Recognised {
    Verb(Verb),
    /// A strict prefix of a verb: not yet an error, the rest may be in the next read.
    Partial,
    Unknown,
}

fn recognise_verb(word: &[u8]) -> Recognised {
    // PING, PONG and +OK are matched on their prefix: nats-server ignores anything after
    // them up to the newline (`PINGX` is a ping). The others must be the whole word, or a
    // prefix of one while the word is still arriving.
    const FIXED: [(&[u8], Verb); 3] = [
        (b"PING", Verb::Ping),
        (b"PONG", Verb::Pong),
        (b"+OK", Verb::Ok),
    ];
    const WORDS: [(&[u8], Verb); 7] = [
        (b"PUB", Verb::Pub),
        (b"HPUB", Verb::Hpub),
        (b"SUB", Verb::Sub),
        (b"UNSUB", Verb::Unsub),
        (b"CONNECT", Verb::Connect),
        (b"INFO", Verb::Info),
        (b"-ERR", Verb::Err),
    ];
    for (name, verb) in FIXED {
        if word.len() >= name.len() && word[..name.len()].eq_ignore_ascii_case(name) {
            return Recognised::Verb(verb);
        }
    }
    for (name, verb) in WORDS {
        if word.eq_ignore_ascii_case(name) {
            return Recognised::Verb(verb);
        }
    }
    let is_prefix = FIXED
        .iter()
        .chain(WORDS.iter())
        .any(|(name, _)| word.len() < name.len() && name[..word.len()].eq_ignore_ascii_case(word));
    if is_prefix {
        Recognised::Partial
    } else {
        Recognised::Unknown
    }
}

fn is_separator(byte: u8) -> bool {
    byte == b' ' || byte == b'\t'
}

/// The whitespace-separated arguments of a control line, as offsets. A fixed array, not a
/// Vec: this runs once per op, and no op has more than four arguments (a fifth is kept only
/// so "too many" can be told apart).
struct Arguments {
    spans: [(usize, usize); 5],
    count: usize,
}

impl Arguments {
    fn len(&self) -> usize {
        self.count
    }
}

impl std::ops::Index<usize> for Arguments {
    type Output = (usize, usize);
    fn index(&self, index: usize) -> &(usize, usize) {
        &self.spans[..self.count][index]
    }
}

fn split_arguments(line: &[u8], start: usize, end: usize) -> Arguments {
    let mut arguments = Arguments {
        spans: [(0, 0); 5],
        count: 0,
    };
    let mut position = start;
    while position < end {
        while position < end && is_separator(line[position]) {
            position += 1;
        }
        let begin = position;
        while position < end && !is_separator(line[position]) {
            position += 1;
        }
        if begin < position {
            if arguments.count == arguments.spans.len() {
                // Too many for any verb; the callers reject counts above four.
                break;
            }
            arguments.spans[arguments.count] = (begin, position);
            arguments.count += 1;
        }
    }
    arguments
}

/// A decimal size; `None` for anything else (empty, signs, overflow), like nats' parseSize.
fn parse_size(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    digits.iter().try_fold(0usize, |total, &byte| {
        byte.is_ascii_digit()
            .then(|| total * 10 + usize::from(byte - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parser() -> Parser {
        Parser {
            max_control_line: 4096,
            max_payload: 1024,
        }
    }

    fn parse_all(input: &[u8]) -> (Vec<ClientOp>, Option<ProtocolError>, usize) {
        let mut buffer = BytesMut::from(input);
        let mut ops = Vec::new();
        loop {
            match parser().parse(&mut buffer) {
                Ok(Parsed::Op(op)) => ops.push(op),
                Ok(Parsed::NeedMore { .. }) => return (ops, None, buffer.len()),
                Err(error) => return (ops, Some(error), buffer.len()),
            }
        }
    }

    fn publish(
        subject: &str,
        reply: Option<&str>,
        header_len: Option<usize>,
        payload: &str,
    ) -> ClientOp {
        ClientOp::Publish(Publish::of(
            subject.as_bytes(),
            reply.map(str::as_bytes),
            header_len,
            payload.as_bytes(),
        ))
    }

    fn subscribe(subject: &str, queue: Option<&str>, sid: &str) -> ClientOp {
        ClientOp::Subscribe {
            subject: Bytes::copy_from_slice(subject.as_bytes()),
            queue: queue.map(|queue| Bytes::copy_from_slice(queue.as_bytes())),
            sid: Bytes::copy_from_slice(sid.as_bytes()),
        }
    }

    #[test]
    fn complete_ops() {
        let cases: Vec<(&[u8], ClientOp)> = vec![
            (b"PING\r\n", ClientOp::Ping),
            (b"ping\r\n", ClientOp::Ping),
            (b"PINGX\r\n", ClientOp::Ping),
            (b"PONG\r\n", ClientOp::Pong),
            (b"+OK\r\n", ClientOp::Ignored),
            (b"INFO {}\r\n", ClientOp::Ignored),
            (
                b"CONNECT {\"a\":1}\r\n",
                ClientOp::Connect(Bytes::from_static(b"{\"a\":1}")),
            ),
            (b"PUB a 0\r\n\r\n", publish("a", None, None, "")),
            (
                b"pub a  r 5\r\nhello\r\n",
                publish("a", Some("r"), None, "hello"),
            ),
            (b"PUB\ta\t2\r\n\r\n\r\n", publish("a", None, None, "\r\n")),
            (b"PUB a 1\nx\r\n", publish("a", None, None, "x")),
            (
                b"HPUB FOO 22 33\r\nNATS/1.0\r\nBar: Baz\r\n\r\nHello NATS!\r\n",
                publish(
                    "FOO",
                    None,
                    Some(22),
                    "NATS/1.0\r\nBar: Baz\r\n\r\nHello NATS!",
                ),
            ),
            (b"SUB a 1\r\n", subscribe("a", None, "1")),
            (b"sub  a  q  x9\r\n", subscribe("a", Some("q"), "x9")),
            (
                b"UNSUB 1\r\n",
                ClientOp::Unsubscribe {
                    sid: Bytes::from_static(b"1"),
                    max: None,
                },
            ),
            (
                b"UNSUB 1 5\r\n",
                ClientOp::Unsubscribe {
                    sid: Bytes::from_static(b"1"),
                    max: Some(5),
                },
            ),
            (
                b"UNSUB 1 x\r\n",
                ClientOp::Unsubscribe {
                    sid: Bytes::from_static(b"1"),
                    max: None,
                },
            ),
        ];
        for (input, expected) in cases {
            let (ops, error, left) = parse_all(input);
            assert_eq!(
                (ops, error, left),
                (vec![expected], None, 0),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn malformed_ops() {
        let cases: Vec<(&[u8], ProtocolError)> = vec![
            (b"FOO\r\n", ProtocolError::UnknownOperation),
            (b"MSG a 1 1\r\nx\r\n", ProtocolError::UnknownOperation),
            (b"-ERR\r\n", ProtocolError::UnknownOperation),
            (b"-ERR 'x'\r\n", ProtocolError::BadArguments),
            (b"PI PING\r\n", ProtocolError::UnknownOperation),
            (b"\r\n", ProtocolError::UnknownOperation),
            (b"PUBX a 1\r\n", ProtocolError::UnknownOperation),
            (b"UNSUB\r\n", ProtocolError::UnknownOperation),
            (b"PUB a 2\r\nabc\r\n", ProtocolError::UnknownOperation),
            (b"PUB a\r\n", ProtocolError::BadArguments),
            (b"PUB a b c d\r\n", ProtocolError::BadArguments),
            (b"PUB a x\r\n", ProtocolError::BadArguments),
            (b"PUB a -1\r\n", ProtocolError::BadArguments),
            (b"HPUB a 6 5\r\nhello\r\n", ProtocolError::BadArguments),
            (b"SUB a\r\n", ProtocolError::BadArguments),
            (b"SUB a 1 2 3\r\n", ProtocolError::BadArguments),
            (b"UNSUB 1 2 3\r\n", ProtocolError::BadArguments),
            (b"PUB a 1025\r\n", ProtocolError::PayloadTooLarge),
            (b"HPUB a 10 1025\r\n", ProtocolError::PayloadTooLarge),
        ];
        for (input, expected) in cases {
            let (_, error, _) = parse_all(input);
            assert_eq!(
                error,
                Some(expected),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn control_line_limit_counts_arguments_only() {
        let at_limit = format!("PUB {} 0\r\n\r\n", "a".repeat(4094));
        let over_limit = format!("PUB {} 0\r\n\r\n", "a".repeat(4095));
        let unterminated = format!("PUB {}", "a".repeat(5000));
        let cases = [
            (at_limit.as_str(), None),
            (
                over_limit.as_str(),
                Some(ProtocolError::ControlLineExceeded),
            ),
            (
                unterminated.as_str(),
                Some(ProtocolError::ControlLineExceeded),
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(
                parse_all(input.as_bytes()).1,
                expected,
                "{} bytes",
                input.len()
            );
        }
    }

    #[test]
    fn every_split_point_gives_the_same_ops() {
        let input: &[u8] = b"CONNECT {}\r\nSUB a 1\r\nPUB a r 3\r\nx\ny\r\nHPUB a 12 14\r\nNATS/1.0\r\n\r\nhi\r\nPING\r\n";
        let (expected, error, _) = parse_all(input);
        assert_eq!((expected.len(), error), (5, None));
        for split in 0..input.len() {
            let mut buffer = BytesMut::from(&input[..split]);
            let mut ops = Vec::new();
            let mut fed = false;
            loop {
                match parser().parse(&mut buffer).expect("valid input") {
                    Parsed::Op(op) => ops.push(op),
                    Parsed::NeedMore { .. } if !fed => {
                        buffer.extend_from_slice(&input[split..]);
                        fed = true;
                    }
                    Parsed::NeedMore { .. } => break,
                }
            }
            assert_eq!(ops, expected, "split at {split}");
        }
    }

    #[test]
    fn need_more_reports_the_frame_size() {
        let mut buffer = BytesMut::from(&b"PUB a 100\r\nabc"[..]);
        assert_eq!(
            parser().parse(&mut buffer),
            Ok(Parsed::NeedMore { frame_len: 113 })
        );
    }
}

/// Properties over arbitrary input (proptest, a bounded number of cases per `cargo test`).
#[cfg(test)]
mod prop {
    use super::*;
    use proptest::prelude::*;

    const MAX_CONTROL_LINE: usize = 64;
    const MAX_PAYLOAD: usize = 32;

    fn parser() -> Parser {
        Parser {
            max_control_line: MAX_CONTROL_LINE,
            max_payload: MAX_PAYLOAD,
        }
    }

    /// The largest read `feed` delivers at once.
    const MAX_READ: usize = 64;

    /// The most a connection ever keeps buffered while the parser says "need more": the
    /// longest verb and a full control line (all that may wait without a newline), the read
    /// that brings the newline (separators before the arguments do not count toward the
    /// line, as in nats-server), and a full payload with its CRLF.
    const RETAINED_LIMIT: usize = LONGEST_VERB + MAX_CONTROL_LINE + 1 + MAX_READ + MAX_PAYLOAD + 2;

    /// Pieces that look like the protocol, so the cases reach past the verb; mixed with
    /// arbitrary bytes.
    fn piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(b"PUB ".to_vec()),
            Just(b"HPUB ".to_vec()),
            Just(b"SUB ".to_vec()),
            Just(b"UNSUB ".to_vec()),
            Just(b"CONNECT {}".to_vec()),
            Just(b"PING".to_vec()),
            Just(b"PONG".to_vec()),
            Just(b"+OK".to_vec()),
            Just(b"-ERR x".to_vec()),
            Just(b"INFO {}".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(b"\n".to_vec()),
            Just(b" ".to_vec()),
            Just(b"\t".to_vec()),
            Just(b"a.b".to_vec()),
            Just(b"*".to_vec()),
            Just(b">".to_vec()),
            (0usize..80).prop_map(|n| n.to_string().into_bytes()),
            Just(b"99999999999999999999".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..12),
        ]
    }

    fn stream() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(piece(), 0..40).prop_map(|pieces| pieces.concat())
    }

    /// Feeds `input` in chunks of the given sizes, as reads would deliver it. Returns the ops,
    /// the error that ended the stream (if any) and the largest buffer kept between reads.
    fn feed(input: &[u8], chunks: &[usize]) -> (Vec<ClientOp>, Option<ProtocolError>, usize) {
        let mut buffer = BytesMut::new();
        let mut ops = Vec::new();
        let mut retained = 0;
        let mut rest = input;
        let mut sizes = chunks.iter().cycle();
        loop {
            let size = (*sizes.next().unwrap_or(&1)).clamp(1, rest.len().max(1));
            let (chunk, tail) = rest.split_at(size.min(rest.len()));
            buffer.extend_from_slice(chunk);
            rest = tail;
            loop {
                let before = buffer.len();
                match parser().parse(&mut buffer) {
                    Ok(Parsed::Op(op)) => {
                        assert!(buffer.len() < before, "an op consumes bytes");
                        ops.push(op);
                    }
                    Ok(Parsed::NeedMore { frame_len }) => {
                        assert_eq!(buffer.len(), before, "need-more consumes nothing");
                        assert!(frame_len <= RETAINED_LIMIT, "frame_len {frame_len}");
                        break;
                    }
                    Err(error) => return (ops, Some(error), retained),
                }
            }
            retained = retained.max(buffer.len());
            if rest.is_empty() {
                return (ops, None, retained);
            }
        }
    }

    /// Found by `any_bytes_are_parsed_or_refused`: `PING` followed by bytes that never end
    /// the word was kept waiting without limit.
    #[test]
    fn a_ping_prefix_without_end_is_refused() {
        for tail in [&b"9"[..], b"9PUB "] {
            let mut input = b"PING".to_vec();
            while input.len() < 10 * MAX_CONTROL_LINE {
                input.extend_from_slice(tail);
            }
            let (ops, error, retained) = feed(&input, &[1]);
            assert!(ops.is_empty());
            assert_eq!(error, Some(ProtocolError::ControlLineExceeded));
            assert!(
                retained <= LONGEST_VERB + MAX_CONTROL_LINE + 1,
                "{retained}"
            );
        }
        // A long PING line that ends arrives whole: still a ping.
        let (ops, error, _) = feed(b"PING99999\r\n", &[64]);
        assert_eq!((ops, error), (vec![ClientOp::Ping], None));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any bytes, cut anywhere: no panic, every step either yields an op, waits, or
        /// refuses; what is kept waiting never exceeds one control line plus one payload.
        #[test]
        fn any_bytes_are_parsed_or_refused(
            input in prop_oneof![stream(), proptest::collection::vec(any::<u8>(), 0..512)],
            chunks in proptest::collection::vec(1usize..=MAX_READ, 1..8),
        ) {
            let (_, _, retained) = feed(&input, &chunks);
            prop_assert!(retained <= RETAINED_LIMIT, "kept {retained} bytes");
        }

        /// How the bytes are cut into reads changes nothing while every control line fits:
        /// the same ops and the same error as when everything arrives at once.
        #[test]
        fn read_boundaries_do_not_matter(
            input in stream(),
            chunks in proptest::collection::vec(1usize..16, 1..8),
        ) {
            // A line longer than the limit may pass when it arrives whole and be refused
            // when it trickles in (the limit applies to what waits for its newline).
            prop_assume!(input.split(|&byte| byte == b'\n').all(|line| line.len() <= MAX_CONTROL_LINE));
            let whole = feed(&input, &[input.len().max(1)]);
            let cut = feed(&input, &chunks);
            prop_assert_eq!(&whole.0, &cut.0);
            prop_assert_eq!(whole.1, cut.1);
        }

        /// Each well-formed PUB/SUB/UNSUB/PING comes back as exactly the op it encodes.
        #[test]
        fn well_formed_ops_round_trip(
            ops in proptest::collection::vec(
                (0u8..4, "[a-z]{1,5}(\\.[a-z*]{1,3}){0,2}", "[0-9]{1,3}",
                 proptest::collection::vec(any::<u8>(), 0..MAX_PAYLOAD)),
                0..12,
            ),
        ) {
            let mut input = Vec::new();
            let mut expected = Vec::new();
            for (kind, subject, sid, payload) in ops {
                match kind {
                    0 => {
                        input.extend_from_slice(format!("PUB {subject} {}\r\n", payload.len()).as_bytes());
                        input.extend_from_slice(&payload);
                        input.extend_from_slice(b"\r\n");
                        expected.push(ClientOp::Publish(Publish::of(
                            subject.as_bytes(),
                            None,
                            None,
                            &payload,
                        )));
                    }
                    1 => {
                        input.extend_from_slice(format!("SUB {subject} {sid}\r\n").as_bytes());
                        expected.push(ClientOp::Subscribe {
                            subject: Bytes::from(subject.into_bytes()),
                            queue: None,
                            sid: Bytes::from(sid.into_bytes()),
                        });
                    }
                    2 => {
                        input.extend_from_slice(format!("UNSUB {sid}\r\n").as_bytes());
                        expected.push(ClientOp::Unsubscribe { sid: Bytes::from(sid.into_bytes()), max: None });
                    }
                    _ => {
                        input.extend_from_slice(b"PING\r\n");
                        expected.push(ClientOp::Ping);
                    }
                }
            }
            let (got, error, _) = feed(&input, &[7]);
            prop_assert_eq!(error, None);
            prop_assert_eq!(got, expected);
        }
    }
}

/// Writes the control line of a MSG (or, with `header_len`, HMSG) frame into `head`
/// (cleared first): `MSG <subject> <sid> [reply] <#bytes>\r\n` or
/// `HMSG <subject> <sid> [reply] <#header bytes> <#total bytes>\r\n`. The one place both
/// deliveries, over a connection and in process, build it.
pub(super) fn write_msg_head(
    head: &mut Vec<u8>,
    subject: &str,
    sid: &[u8],
    reply: Option<&[u8]>,
    header_len: Option<usize>,
    payload_len: usize,
) {
    head.clear();
    head.extend_from_slice(if header_len.is_some() {
        b"HMSG "
    } else {
        b"MSG "
    });
    head.extend_from_slice(subject.as_bytes());
    head.push(b' ');
    head.extend_from_slice(sid);
    head.push(b' ');
    if let Some(reply) = reply {
        head.extend_from_slice(reply);
        head.push(b' ');
    }
    let mut number = itoa::Buffer::new();
    if let Some(header_len) = header_len {
        head.extend_from_slice(number.format(header_len).as_bytes());
        head.push(b' ');
    }
    head.extend_from_slice(number.format(payload_len).as_bytes());
    head.extend_from_slice(b"\r\n");
}
