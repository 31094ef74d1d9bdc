//! A component of the wrong world (`wasi:cli/command`, not `idem:agent/agent`): the host
//! must refuse to run it, with an error that says why.

fn main() {
    println!("hello");
}
