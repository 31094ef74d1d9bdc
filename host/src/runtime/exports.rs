//! What a component exports, as one line of text: what an upgrade compares to tell
//! whether a run's next instance can be of another version's component.
//!
//! Every component the host runs is an agent (`engine.rs` links it against the
//! `idem:agent` world and checks its `run` export), so two agents differ here only in
//! what they export beyond or instead of that: another world. The rendering is idem's
//! own (names and WIT-like types, sorted), not wasmtime's `Debug`, so that it means the
//! same across wasmtime versions and a store keeps it ([`LoadedAgent::exports`]).

use wasmtime::Engine;
use wasmtime::component::types::{ComponentFunc, ComponentItem, Type};

use super::engine::LoadedAgent;

impl LoadedAgent {
    /// What the agent's component exports: each export's name and type, sorted, on one
    /// line (`run: func(input: list<u8>) -> result<list<u8>, string>` for an agent
    /// that exports only the world's `run`).
    pub fn exports(&self) -> String {
        let component = self.pre.instance_pre().component();
        render_exports(component.engine(), &component.component_type())
    }
}

fn render_exports(engine: &Engine, component: &wasmtime::component::types::Component) -> String {
    let mut items: Vec<String> = component
        .exports(engine)
        .map(|(name, item)| format!("{name}: {}", item_text(engine, &item.ty)))
        .collect();
    items.sort();
    items.join("; ")
}

fn item_text(engine: &Engine, item: &ComponentItem) -> String {
    match item {
        ComponentItem::ComponentFunc(func) => func_text(func),
        ComponentItem::CoreFunc(_) => "core func".to_owned(),
        ComponentItem::Module(_) => "core module".to_owned(),
        ComponentItem::Component(component) => {
            format!("component {{ {} }}", render_exports(engine, component))
        }
        ComponentItem::ComponentInstance(instance) => {
            let mut items: Vec<String> = instance
                .exports(engine)
                .map(|(name, item)| format!("{name}: {}", item_text(engine, &item.ty)))
                .collect();
            items.sort();
            format!("instance {{ {} }}", items.join("; "))
        }
        ComponentItem::Type(ty) => format!("type {}", type_text(ty)),
        ComponentItem::Resource(_) => "resource".to_owned(),
    }
}

fn func_text(func: &ComponentFunc) -> String {
    let params: Vec<String> = func
        .params()
        .map(|(name, ty)| format!("{name}: {}", type_text(&ty)))
        .collect();
    let results: Vec<String> = func.results().map(|ty| type_text(&ty)).collect();
    match results.as_slice() {
        [] => format!("func({})", params.join(", ")),
        [one] => format!("func({}) -> {one}", params.join(", ")),
        many => format!("func({}) -> ({})", params.join(", "), many.join(", ")),
    }
}

fn type_text(ty: &Type) -> String {
    let opt = |ty: Option<Type>| ty.map_or_else(|| "_".to_owned(), |ty| type_text(&ty));
    match ty {
        Type::Bool => "bool".into(),
        Type::S8 => "s8".into(),
        Type::U8 => "u8".into(),
        Type::S16 => "s16".into(),
        Type::U16 => "u16".into(),
        Type::S32 => "s32".into(),
        Type::U32 => "u32".into(),
        Type::S64 => "s64".into(),
        Type::U64 => "u64".into(),
        Type::Float32 => "f32".into(),
        Type::Float64 => "f64".into(),
        Type::Char => "char".into(),
        Type::String => "string".into(),
        Type::List(list) => format!("list<{}>", type_text(&list.ty())),
        Type::Record(record) => {
            let fields: Vec<String> = record
                .fields()
                .map(|f| format!("{}: {}", f.name, type_text(&f.ty)))
                .collect();
            format!("record {{ {} }}", fields.join(", "))
        }
        Type::Tuple(tuple) => {
            let types: Vec<String> = tuple.types().map(|ty| type_text(&ty)).collect();
            format!("tuple<{}>", types.join(", "))
        }
        Type::Variant(variant) => {
            let cases: Vec<String> = variant
                .cases()
                .map(|c| match c.ty {
                    Some(ty) => format!("{}({})", c.name, type_text(&ty)),
                    None => c.name.to_owned(),
                })
                .collect();
            format!("variant {{ {} }}", cases.join(", "))
        }
        Type::Enum(e) => format!("enum {{ {} }}", e.names().collect::<Vec<_>>().join(", ")),
        Type::Option(option) => format!("option<{}>", type_text(&option.ty())),
        Type::Result(result) => format!("result<{}, {}>", opt(result.ok()), opt(result.err())),
        Type::Flags(flags) => format!(
            "flags {{ {} }}",
            flags.names().collect::<Vec<_>>().join(", ")
        ),
        Type::Own(_) => "own<resource>".into(),
        Type::Borrow(_) => "borrow<resource>".into(),
        Type::Future(future) => format!("future<{}>", opt(future.ty())),
        Type::Stream(stream) => format!("stream<{}>", opt(stream.ty())),
        Type::ErrorContext => "error-context".into(),
        // Types of proposals the host does not enable: named, never taken apart.
        other => format!("{other:?}"),
    }
}
