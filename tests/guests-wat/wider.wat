;; An `idem:agent` that exports one function more than the world's `run`: `describe:
;; func() -> string`, as its own world `wider` (in `wider.wit`) says. It runs as an
;; agent (returns its input as its output), but it is not a build of any agent that
;; exports `run` alone: an upgrade from one to it is refused.
(module
  (memory (export "memory") 1)
  (data (i32.const 64) "wider")

  ;; The next free byte; below it, the return area at 16.
  (global $next (mut i32) (i32.const 1024))

  ;; A bump allocator: the host only ever allocates the input here.
  (func (export "cabi_realloc")
    (param $old i32) (param $old_size i32) (param $align i32) (param $size i32)
    (result i32)
    (local $at i32)
    (local.set $at
      (i32.and
        (i32.add (global.get $next) (i32.sub (local.get $align) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get $align))))
    (global.set $next (i32.add (local.get $at) (local.get $size)))
    (local.get $at))

  ;; `run: func(input: list<u8>) -> result<list<u8>, string>`: `ok(input)`.
  (func (export "run") (param $ptr i32) (param $len i32) (result i32)
    (i32.store (i32.const 16) (i32.const 0))
    (i32.store (i32.const 20) (local.get $ptr))
    (i32.store (i32.const 24) (local.get $len))
    (i32.const 16))

  ;; `describe: func() -> string`: "wider".
  (func (export "describe") (result i32)
    (i32.store (i32.const 32) (i32.const 64))
    (i32.store (i32.const 36) (i32.const 5))
    (i32.const 32)))
