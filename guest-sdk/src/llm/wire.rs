//! The two wire formats: a [`Conversation`](super::Conversation) as the body of an
//! OpenAI chat completion or an Anthropic Messages request, and a response body as a
//! [`Parsed`] reply. Pure functions of their input, so a replay builds the same request
//! and decodes the committed body to the same reply.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{Message, Provider, Role, Tool, ToolCall, Usage};

/// What a response body says, before the step it came from is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parsed {
    pub(crate) message: Message,
    pub(crate) stop_reason: String,
    pub(crate) usage: Usage,
}

/// The request body for `model` to continue `messages`, with `tools` offered.
pub(crate) fn request(
    provider: Provider,
    model: &str,
    max_tokens: u32,
    messages: &[Message],
    tools: &[Tool],
) -> String {
    let body = match provider {
        Provider::OpenAi => openai_request(model, max_tokens, messages, tools),
        Provider::Anthropic => anthropic_request(model, max_tokens, messages, tools),
    };
    body.to_string()
}

/// Decodes a response body; `Err` says what is wrong with it.
pub(crate) fn parse(provider: Provider, body: &[u8]) -> Result<Parsed, String> {
    match provider {
        Provider::OpenAi => openai_parse(body),
        Provider::Anthropic => anthropic_parse(body),
    }
}

fn openai_request(model: &str, max_tokens: u32, messages: &[Message], tools: &[Tool]) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|m| {
            let mut o = Map::new();
            o.insert("role".into(), json!(m.role.as_str()));
            o.insert("content".into(), json!(m.content));
            if !m.tool_calls.is_empty() {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}})
                    })
                    .collect();
                o.insert("tool_calls".into(), Value::Array(calls));
            }
            if let Some(id) = &m.tool_call_id {
                o.insert("tool_call_id".into(), json!(id));
            }
            Value::Object(o)
        })
        .collect();
    let mut body = json!({"model": model, "max_tokens": max_tokens, "messages": messages});
    if !tools.is_empty() {
        body["tools"] = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters}})
            })
            .collect();
    }
    body
}

fn anthropic_request(model: &str, max_tokens: u32, messages: &[Message], tools: &[Tool]) -> Value {
    let system: Vec<&str> = messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| m.content.as_str())
        .collect();
    // Anthropic takes tool results as blocks of a user message; consecutive results
    // (one turn's parallel calls) share one.
    let mut out: Vec<Value> = Vec::new();
    for m in messages.iter().filter(|m| m.role != Role::System) {
        let (role, blocks) = match m.role {
            Role::Tool => (
                "user",
                vec![json!({"type": "tool_result",
                            "tool_use_id": m.tool_call_id.as_deref().unwrap_or_default(),
                            "content": m.content})],
            ),
            Role::Assistant => {
                let mut blocks = Vec::new();
                if !m.content.is_empty() {
                    blocks.push(json!({"type": "text", "text": m.content}));
                }
                for c in &m.tool_calls {
                    let input: Value =
                        serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
                    blocks.push(
                        json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}),
                    );
                }
                ("assistant", blocks)
            }
            _ => ("user", vec![json!({"type": "text", "text": m.content})]),
        };
        let merge = m.role == Role::Tool
            && out.last().is_some_and(|last: &Value| {
                last["role"] == "user"
                    && last["content"]
                        .as_array()
                        .and_then(|b| b.first())
                        .is_some_and(|b| b["type"] == "tool_result")
            });
        match out.last_mut() {
            Some(last) if merge => {
                if let Some(existing) = last["content"].as_array_mut() {
                    existing.extend(blocks);
                }
            }
            _ => out.push(json!({"role": role, "content": blocks})),
        }
    }
    let mut body = json!({"model": model, "max_tokens": max_tokens, "messages": out});
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    if !tools.is_empty() {
        body["tools"] = tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect();
    }
    body
}

#[derive(Deserialize)]
struct OpenAiResponse {
    choices: Vec<OpenAiChoice>,
    #[serde(default)]
    usage: Option<OpenAiUsage>,
}

#[derive(Deserialize)]
struct OpenAiChoice {
    message: OpenAiMessage,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct OpenAiMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<OpenAiToolCall>,
}

#[derive(Deserialize)]
struct OpenAiToolCall {
    id: String,
    function: OpenAiFunction,
}

#[derive(Deserialize)]
struct OpenAiFunction {
    name: String,
    arguments: String,
}

#[derive(Deserialize)]
struct OpenAiUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<OpenAiPromptDetails>,
}

#[derive(Deserialize)]
struct OpenAiPromptDetails {
    #[serde(default)]
    cached_tokens: u64,
}

fn openai_parse(body: &[u8]) -> Result<Parsed, String> {
    let r: OpenAiResponse = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let choice = r.choices.into_iter().next().ok_or("`choices` is empty")?;
    let usage = r.usage.map_or_else(Usage::default, |u| Usage {
        input_tokens: u.prompt_tokens,
        output_tokens: u.completion_tokens,
        cached_tokens: u.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
    });
    Ok(Parsed {
        message: Message {
            role: Role::Assistant,
            content: choice.message.content.unwrap_or_default(),
            tool_calls: choice
                .message
                .tool_calls
                .into_iter()
                .map(|c| ToolCall {
                    id: c.id,
                    name: c.function.name,
                    arguments: c.function.arguments,
                })
                .collect(),
            tool_call_id: None,
        },
        stop_reason: choice.finish_reason.unwrap_or_default(),
        usage,
    })
}

#[derive(Deserialize)]
struct AnthropicResponse {
    content: Vec<AnthropicBlock>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<AnthropicUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum AnthropicBlock {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct AnthropicUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
}

fn anthropic_parse(body: &[u8]) -> Result<Parsed, String> {
    let r: AnthropicResponse = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    for block in r.content {
        match block {
            AnthropicBlock::Text { text } => content.push_str(&text),
            AnthropicBlock::ToolUse { id, name, input } => tool_calls.push(ToolCall {
                id,
                name,
                arguments: input.to_string(),
            }),
            AnthropicBlock::Other => {}
        }
    }
    let usage = r.usage.map_or_else(Usage::default, |u| Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cached_tokens: u.cache_read_input_tokens,
    });
    Ok(Parsed {
        message: Message {
            role: Role::Assistant,
            content,
            tool_calls,
            tool_call_id: None,
        },
        stop_reason: r.stop_reason.unwrap_or_default(),
        usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation() -> Vec<Message> {
        vec![
            Message::system("be brief"),
            Message::user("weather in Oslo?"),
            Message {
                role: Role::Assistant,
                content: String::new(),
                tool_calls: vec![
                    ToolCall {
                        id: "c1".into(),
                        name: "weather".into(),
                        arguments: r#"{"city":"Oslo"}"#.into(),
                    },
                    ToolCall {
                        id: "c2".into(),
                        name: "time".into(),
                        arguments: "{}".into(),
                    },
                ],
                tool_call_id: None,
            },
            Message::tool("c1", "rain"),
            Message::tool("c2", "noon"),
        ]
    }

    fn tools() -> Vec<Tool> {
        vec![Tool::new(
            "weather",
            "the weather in a city",
            json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        )]
    }

    #[test]
    fn openai_requests_carry_tool_calls_and_results() {
        let body: Value = serde_json::from_str(&request(
            Provider::OpenAi,
            "m",
            64,
            &conversation(),
            &tools(),
        ))
        .unwrap();
        assert_eq!(body["model"], "m");
        assert_eq!(
            body["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(
            body["messages"][2]["tool_calls"][0],
            json!({"id": "c1", "type": "function",
                   "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}})
        );
        assert_eq!(
            body["messages"][4],
            json!({"role": "tool", "content": "noon", "tool_call_id": "c2"})
        );
        assert_eq!(body["tools"][0]["function"]["name"], "weather");
    }

    #[test]
    fn anthropic_requests_lift_the_system_prompt_and_merge_tool_results() {
        let body: Value = serde_json::from_str(&request(
            Provider::Anthropic,
            "m",
            64,
            &conversation(),
            &tools(),
        ))
        .unwrap();
        assert_eq!(body["system"], "be brief");
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3, "{body}");
        assert_eq!(
            messages[1]["content"][0],
            json!({"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Oslo"}})
        );
        assert_eq!(messages[2]["role"], "user");
        assert_eq!(messages[2]["content"].as_array().unwrap().len(), 2);
        assert_eq!(messages[2]["content"][1]["tool_use_id"], "c2");
        assert_eq!(body["tools"][0]["input_schema"]["type"], "object");
    }

    #[test]
    fn openai_responses_give_calls_and_usage() {
        let body = br#"{"id":"x","choices":[{"index":0,"message":{"role":"assistant",
            "content":null,"tool_calls":[{"id":"c1","type":"function","function":
            {"name":"weather","arguments":"{\"city\":\"Oslo\"}"}}]},"finish_reason":"tool_calls"}],
            "usage":{"prompt_tokens":12,"completion_tokens":5,
            "prompt_tokens_details":{"cached_tokens":8}}}"#;
        let p = parse(Provider::OpenAi, body).unwrap();
        assert_eq!(p.message.tool_calls[0].name, "weather");
        assert_eq!(p.message.tool_calls[0].arguments, r#"{"city":"Oslo"}"#);
        assert_eq!(p.stop_reason, "tool_calls");
        assert_eq!(
            p.usage,
            Usage {
                input_tokens: 12,
                output_tokens: 5,
                cached_tokens: 8
            }
        );
    }

    #[test]
    fn anthropic_responses_give_text_calls_and_usage() {
        let body = br#"{"content":[{"type":"text","text":"let me see"},{"type":"tool_use",
            "id":"t1","name":"weather","input":{"city":"Oslo"}},{"type":"thinking"}],
            "stop_reason":"tool_use","usage":{"input_tokens":3,"output_tokens":4,
            "cache_read_input_tokens":2}}"#;
        let p = parse(Provider::Anthropic, body).unwrap();
        assert_eq!(p.message.content, "let me see");
        assert_eq!(p.message.tool_calls[0].arguments, r#"{"city":"Oslo"}"#);
        assert_eq!(p.stop_reason, "tool_use");
        assert_eq!(p.usage.cached_tokens, 2);
    }

    #[test]
    fn malformed_and_truncated_responses_are_refused() {
        for body in [
            &b"{\"choices\":[{\"message\":{\"content\":\"hi"[..],
            b"<html>bad gateway</html>",
            b"{\"choices\":[]}",
            b"{\"choices\":[{\"message\":{\"tool_calls\":[{\"id\":1}]}}]}",
        ] {
            assert!(parse(Provider::OpenAi, body).is_err(), "{body:?}");
        }
        assert!(parse(Provider::Anthropic, b"{\"content\":").is_err());
    }
}
