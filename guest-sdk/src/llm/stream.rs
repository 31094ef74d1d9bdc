//! A streamed response: the server-sent events of an OpenAI chat completion
//! (`stream: true`, with `stream_options.include_usage`) or an Anthropic Messages
//! stream, read as they arrive. Each text delta is handed out at once (to be published
//! on the run's live stream); at the end the events are assembled into the body the
//! same call would have answered without streaming, which is what the step commits: a
//! replay decodes it like any other response.

use serde_json::{Map, Value, json};

use super::Provider;

/// The request body `body` (as [`wire::request`](super::wire::request) made it) asking
/// for a stream.
pub(crate) fn request(provider: Provider, body: &str) -> String {
    let Ok(Value::Object(mut o)) = serde_json::from_str::<Value>(body) else {
        return body.to_owned();
    };
    o.insert("stream".into(), Value::Bool(true));
    if provider == Provider::OpenAi {
        o.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Value::Object(o).to_string()
}

/// Reads a stream's bytes as they come and assembles its response.
#[derive(Debug)]
pub(crate) struct Assembler {
    provider: Provider,
    /// Bytes of an event not yet complete.
    pending: Vec<u8>,
    /// The first thing wrong with the stream, if any.
    error: Option<String>,
    /// Whether the stream said it was complete (`[DONE]`, a finish reason,
    /// `message_stop`).
    ended: bool,
    openai: OpenAi,
    anthropic: Anthropic,
}

#[derive(Debug, Default)]
struct OpenAi {
    id: Option<Value>,
    model: Option<Value>,
    content: String,
    /// Tool calls by their index: id, name, arguments so far.
    calls: Vec<(String, String, String)>,
    finish_reason: Option<String>,
    usage: Option<Value>,
}

#[derive(Debug, Default)]
struct Anthropic {
    /// The message as `message_start` gave it.
    message: Map<String, Value>,
    /// Content blocks by index: the block, and a tool call's input JSON so far.
    blocks: Vec<(Map<String, Value>, String)>,
    stop_reason: Option<Value>,
    stop_sequence: Option<Value>,
    usage: Map<String, Value>,
}

impl Assembler {
    pub(crate) fn new(provider: Provider) -> Assembler {
        Assembler {
            provider,
            pending: Vec::new(),
            error: None,
            ended: false,
            openai: OpenAi::default(),
            anthropic: Anthropic::default(),
        }
    }

    /// Takes the next bytes of the body; returns the text deltas they complete, in
    /// order.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut deltas = Vec::new();
        while let Some((end, sep)) = event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end + sep).take(end).collect();
            if self.error.is_none() {
                self.event(&String::from_utf8_lossy(&event), &mut deltas);
            }
        }
        deltas
    }

    /// The response body the stream amounts to, or what is wrong with it.
    pub(crate) fn finish(mut self) -> Result<String, String> {
        if !self.pending.iter().all(u8::is_ascii_whitespace) {
            // A last event without its blank line: complete once the body ended.
            let event = String::from_utf8_lossy(&std::mem::take(&mut self.pending)).into_owned();
            self.event(&event, &mut Vec::new());
        }
        if let Some(error) = self.error {
            return Err(error);
        }
        if !self.ended {
            return Err("the stream ended before the response was complete".into());
        }
        Ok(match self.provider {
            Provider::OpenAi => self.openai.body(),
            Provider::Anthropic => self.anthropic.body(),
        })
    }

    fn event(&mut self, event: &str, deltas: &mut Vec<String>) {
        let mut name = None;
        let mut data = String::new();
        for line in event.lines() {
            if let Some(value) = field(line, "event") {
                name = Some(value.to_owned());
            } else if let Some(value) = field(line, "data") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(value);
            }
        }
        if data.is_empty() {
            return;
        }
        if self.provider == Provider::OpenAi && data.trim() == "[DONE]" {
            self.ended = true;
            return;
        }
        let value: Value = match serde_json::from_str(&data) {
            Ok(value) => value,
            Err(e) => {
                self.error = Some(format!("an event of the stream is not JSON: {e}"));
                return;
            }
        };
        let outcome = match self.provider {
            Provider::OpenAi => self.openai.chunk(&value, deltas),
            Provider::Anthropic => {
                let name = name.unwrap_or_else(|| value["type"].as_str().unwrap_or("").into());
                self.anthropic.event(&name, &value, deltas)
            }
        };
        match outcome {
            Ok(ended) => self.ended |= ended,
            Err(e) => self.error = Some(e),
        }
    }
}

/// Where the first complete event of `buf` ends, and its separator's length.
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The value of an SSE line `name: value` (one leading space dropped).
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(name)?.strip_prefix(':')?;
    Some(rest.strip_prefix(' ').unwrap_or(rest))
}

fn text(value: &Value) -> Option<&str> {
    value.as_str().filter(|s| !s.is_empty())
}

impl OpenAi {
    /// One `chat.completion.chunk`; whether the response is complete.
    fn chunk(&mut self, v: &Value, deltas: &mut Vec<String>) -> Result<bool, String> {
        if let Some(error) = v.get("error") {
            return Err(format!("the stream reported an error: {error}"));
        }
        if self.id.is_none() {
            self.id = v.get("id").cloned();
            self.model = v.get("model").cloned();
        }
        if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        let Some(choice) = v["choices"].as_array().and_then(|c| c.first()) else {
            return Ok(false);
        };
        let delta = &choice["delta"];
        if let Some(piece) = text(&delta["content"]) {
            self.content.push_str(piece);
            deltas.push(piece.to_owned());
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"]
                .as_u64()
                .and_then(|i| usize::try_from(i).ok())
                .ok_or("a tool call's delta has no index")?;
            if index > 1024 {
                return Err(format!("a tool call's index {index} is absurd"));
            }
            if self.calls.len() <= index {
                self.calls.resize(index + 1, Default::default());
            }
            let slot = &mut self.calls[index];
            if let Some(id) = text(&call["id"]) {
                slot.0 = id.to_owned();
            }
            if let Some(name) = text(&call["function"]["name"]) {
                slot.1.push_str(name);
            }
            if let Some(args) = text(&call["function"]["arguments"]) {
                slot.2.push_str(args);
            }
        }
        if let Some(reason) = text(&choice["finish_reason"]) {
            self.finish_reason = Some(reason.to_owned());
        }
        // Complete once a finish reason came (the usage chunk and `[DONE]` may follow,
        // and a compatible server may send neither).
        Ok(self.finish_reason.is_some())
    }

    fn body(self) -> String {
        let mut message = json!({
            "role": "assistant",
            "content": if self.content.is_empty() && !self.calls.is_empty() {
                Value::Null
            } else {
                Value::String(self.content)
            },
        });
        if !self.calls.is_empty() {
            message["tool_calls"] = self
                .calls
                .into_iter()
                .map(|(id, name, arguments)| {
                    json!({"id": id, "type": "function",
                           "function": {"name": name, "arguments": arguments}})
                })
                .collect();
        }
        let mut body = json!({
            "id": self.id.unwrap_or(Value::Null),
            "object": "chat.completion",
            "model": self.model.unwrap_or(Value::Null),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": self.finish_reason}],
        });
        if let Some(usage) = self.usage {
            body["usage"] = usage;
        }
        body.to_string()
    }
}

impl Anthropic {
    /// One Messages stream event; whether it ended the response.
    fn event(&mut self, name: &str, v: &Value, deltas: &mut Vec<String>) -> Result<bool, String> {
        match name {
            "message_start" => {
                self.message = v["message"].as_object().cloned().unwrap_or_default();
                if let Some(usage) = self.message.get("usage").and_then(Value::as_object) {
                    self.usage = usage.clone();
                }
            }
            "content_block_start" => {
                let index = self.index(v)?;
                let block = v["content_block"].as_object().cloned().unwrap_or_default();
                self.blocks[index] = (block, String::new());
            }
            "content_block_delta" => {
                let index = self.index(v)?;
                let delta = &v["delta"];
                let (block, json) = &mut self.blocks[index];
                match delta["type"].as_str() {
                    Some("text_delta") => {
                        let piece = delta["text"].as_str().unwrap_or_default();
                        let mut text = block
                            .get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned();
                        text.push_str(piece);
                        block.insert("text".into(), Value::String(text));
                        if !piece.is_empty() {
                            deltas.push(piece.to_owned());
                        }
                    }
                    Some("input_json_delta") => {
                        json.push_str(delta["partial_json"].as_str().unwrap_or_default());
                    }
                    // Thinking and signatures are not part of the reply this client reads.
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = self.index(v)?;
                let (block, json) = &mut self.blocks[index];
                if block.get("type").and_then(Value::as_str) == Some("tool_use") && !json.is_empty()
                {
                    let input: Value = serde_json::from_str(json)
                        .map_err(|e| format!("a tool call's input is not JSON: {e}"))?;
                    block.insert("input".into(), input);
                }
            }
            "message_delta" => {
                if let Some(reason) = v["delta"].get("stop_reason") {
                    self.stop_reason = Some(reason.clone());
                }
                if let Some(sequence) = v["delta"].get("stop_sequence") {
                    self.stop_sequence = Some(sequence.clone());
                }
                for (k, n) in v["usage"].as_object().into_iter().flatten() {
                    self.usage.insert(k.clone(), n.clone());
                }
            }
            "message_stop" => return Ok(true),
            "error" => return Err(format!("the stream reported an error: {}", v["error"])),
            // `ping`, and events this client does not know.
            _ => {}
        }
        Ok(false)
    }

    /// The block index an event names, its slot made.
    fn index(&mut self, v: &Value) -> Result<usize, String> {
        let index = v["index"]
            .as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .filter(|i| *i <= 1024)
            .ok_or("a content block event has no usable index")?;
        if self.blocks.len() <= index {
            self.blocks.resize(index + 1, Default::default());
        }
        Ok(index)
    }

    fn body(self) -> String {
        let mut message = self.message;
        let content: Vec<Value> = self
            .blocks
            .into_iter()
            .filter(|(block, _)| !block.is_empty())
            .map(|(block, _)| Value::Object(block))
            .collect();
        message.insert("content".into(), Value::Array(content));
        if let Some(reason) = self.stop_reason {
            message.insert("stop_reason".into(), reason);
        }
        if let Some(sequence) = self.stop_sequence {
            message.insert("stop_sequence".into(), sequence);
        }
        message.insert("usage".into(), Value::Object(self.usage));
        Value::Object(message).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire;
    use super::*;

    /// Feeds `stream` in pieces of `step` bytes: the deltas, and the assembled body.
    fn assemble(provider: Provider, stream: &str, step: usize) -> (Vec<String>, String) {
        let mut asm = Assembler::new(provider);
        let mut deltas = Vec::new();
        for piece in stream.as_bytes().chunks(step) {
            deltas.extend(asm.feed(piece));
        }
        (deltas, asm.finish().unwrap())
    }

    const OPENAI: &str = "data: {\"id\":\"c1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
        data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n\
        data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo ✓\"}}]}\n\n\
        data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"t1\",\"type\":\"function\",\"function\":{\"name\":\"look\",\"arguments\":\"\"}}]}}]}\n\n\
        data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"q\\\":\"}}]}}]}\n\n\
        data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"1}\"}}]}}]}\n\n\
        data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n\
        data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\n\
        data: [DONE]\n\n";

    #[test]
    fn openai_streams_assemble_the_plain_response_in_any_pieces() {
        for step in [1, 7, 64, OPENAI.len()] {
            let (deltas, body) = assemble(Provider::OpenAi, OPENAI, step);
            assert_eq!(deltas.concat(), "Hello ✓", "step {step}");
            let parsed = wire::parse(Provider::OpenAi, body.as_bytes()).unwrap();
            assert_eq!(parsed.message.content, "Hello ✓");
            assert_eq!(parsed.message.tool_calls[0].name, "look");
            assert_eq!(parsed.message.tool_calls[0].arguments, "{\"q\":1}");
            assert_eq!(parsed.stop_reason, "tool_calls");
            assert_eq!(
                (parsed.usage.input_tokens, parsed.usage.output_tokens),
                (9, 4)
            );
        }
    }

    #[test]
    fn anthropic_streams_assemble_the_plain_response() {
        let stream = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":12,\"output_tokens\":1,\"cache_read_input_tokens\":3}}}\r\n\r\n\
            event: content_block_start\r\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\r\n\r\n\
            event: ping\r\ndata: {\"type\":\"ping\"}\r\n\r\n\
            event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me \"}}\r\n\r\n\
            event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"look.\"}}\r\n\r\n\
            event: content_block_stop\r\ndata: {\"type\":\"content_block_stop\",\"index\":0}\r\n\r\n\
            event: content_block_start\r\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"look\",\"input\":{}}}\r\n\r\n\
            event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"q\\\": \"}}\r\n\r\n\
            event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\"x\\\"}\"}}\r\n\r\n\
            event: content_block_stop\r\ndata: {\"type\":\"content_block_stop\",\"index\":1}\r\n\r\n\
            event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\r\n\r\n\
            event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";
        for step in [3, 50, stream.len()] {
            let (deltas, body) = assemble(Provider::Anthropic, stream, step);
            assert_eq!(deltas, ["Let me ", "look."], "step {step}");
            let parsed = wire::parse(Provider::Anthropic, body.as_bytes()).unwrap();
            assert_eq!(parsed.message.content, "Let me look.");
            assert_eq!(parsed.message.tool_calls[0].arguments, "{\"q\":\"x\"}");
            assert_eq!(parsed.stop_reason, "tool_use");
            assert_eq!(
                (
                    parsed.usage.input_tokens,
                    parsed.usage.output_tokens,
                    parsed.usage.cached_tokens
                ),
                (12, 15, 3)
            );
        }
    }

    #[test]
    fn truncated_malformed_and_failed_streams_are_refused() {
        // Cut between events, or inside one.
        let whole: String = OPENAI.split_inclusive("\n\n").take(3).collect();
        let mut asm = Assembler::new(Provider::OpenAi);
        asm.feed(whole.as_bytes());
        assert!(asm.finish().unwrap_err().contains("ended before"));
        let mut asm = Assembler::new(Provider::OpenAi);
        asm.feed(&OPENAI.as_bytes()[..OPENAI.len() / 2]);
        assert!(asm.finish().is_err());
        let mut asm = Assembler::new(Provider::OpenAi);
        asm.feed(b"data: {not json\n\ndata: [DONE]\n\n");
        assert!(asm.finish().unwrap_err().contains("not JSON"));
        let mut asm = Assembler::new(Provider::Anthropic);
        asm.feed(b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n");
        assert!(asm.finish().unwrap_err().contains("overloaded_error"));
    }

    #[test]
    fn stream_requests_ask_for_a_stream_and_its_usage() {
        let body = r#"{"model":"m","messages":[]}"#;
        let openai: Value = serde_json::from_str(&request(Provider::OpenAi, body)).unwrap();
        assert_eq!(openai["stream"], true);
        assert_eq!(openai["stream_options"]["include_usage"], true);
        let anthropic: Value = serde_json::from_str(&request(Provider::Anthropic, body)).unwrap();
        assert_eq!(anthropic["stream"], true);
        assert!(anthropic.get("stream_options").is_none());
    }
}
