;; A hostile `idem:agent` with two linear memories: `$abi`, the one the canonical ABI
;; uses (exported as `memory`), and `$hoard`, which no import or export names, so that
;; only a limit summed over every memory of the instance can see it grow.
;;
;; Input: `[A, H]`, JSON: grows `$abi` by A MiB, then `$hoard` by H MiB, then returns
;; the input as its output. `tests/build.rs` embeds the `idem:agent` world in this
;; module and makes it a component (a Rust guest cannot have a second memory).
(module
  (memory $abi (export "memory") 1)
  (memory $hoard 1)

  ;; The next free byte of `$abi`; below it, the return area at 16.
  (global $next (mut i32) (i32.const 1024))

  ;; A bump allocator: the host only ever allocates the input here.
  (func (export "cabi_realloc")
    (param $old i32) (param $old_size i32) (param $align i32) (param $size i32)
    (result i32)
    (local $at i32)
    ;; Align up: (next + align - 1) & -align.
    (local.set $at
      (i32.and
        (i32.add (global.get $next) (i32.sub (local.get $align) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get $align))))
    (global.set $next (i32.add (local.get $at) (local.get $size)))
    (local.get $at))

  ;; `run: func(input: list<u8>) -> result<list<u8>, string>`.
  (func (export "run") (param $ptr i32) (param $len i32) (result i32)
    (local $i i32) (local $byte i32) (local $n i32) (local $which i32) (local $digits i32)
    ;; Reads the decimal numbers of the input; the first grows `$abi`, the second
    ;; `$hoard`, 16 pages per MiB.
    (block $done
      (loop $next_byte
        (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
        (local.set $byte (i32.load8_u $abi (i32.add (local.get $ptr) (local.get $i))))
        (if (i32.and (i32.ge_u (local.get $byte) (i32.const 48))
                     (i32.le_u (local.get $byte) (i32.const 57)))
          (then
            (local.set $n (i32.add (i32.mul (local.get $n) (i32.const 10))
                                   (i32.sub (local.get $byte) (i32.const 48))))
            (local.set $digits (i32.const 1)))
          (else
            (if (local.get $digits)
              (then
                (if (i32.eqz (local.get $which))
                  (then (drop (memory.grow $abi (i32.mul (local.get $n) (i32.const 16)))))
                  (else (drop (memory.grow $hoard (i32.mul (local.get $n) (i32.const 16))))))
                (local.set $which (i32.add (local.get $which) (i32.const 1)))
                (local.set $n (i32.const 0))
                (local.set $digits (i32.const 0))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next_byte)))
    ;; Touches the last byte of `$hoard`, so the memory is really there.
    (i32.store8 $hoard
      (i32.sub (i32.mul (memory.size $hoard) (i32.const 65536)) (i32.const 1))
      (i32.const 1))
    ;; `ok(input)`: discriminant 0, then the list's pointer and length.
    (i32.store $abi (i32.const 16) (i32.const 0))
    (i32.store $abi (i32.const 20) (local.get $ptr))
    (i32.store $abi (i32.const 24) (local.get $len))
    (i32.const 16)))
