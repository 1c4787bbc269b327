/**
 * @file export.h
 * Symbol visibility. The library is built with -fvisibility=hidden, so only
 * what the public headers declare is exported from libkeepsake.so; internal
 * functions (ks__*) stay inside it.
 *
 * Every public header wraps its declarations in KS_BEGIN_DECLS / KS_END_DECLS,
 * which open and close `extern "C"` for C++ and push default visibility for
 * everything declared in between, so single declarations need no KS_API.
 * KS_API marks one declaration exported where the wrapper is not used.
 *
 * The binding header (binding.h) wraps its declarations in KS_BEGIN_BINDING_DECLS /
 * KS_END_BINDING_DECLS instead, which push hidden visibility: its functions are
 * in the static library (libkeepsake.a) and not exported from libkeepsake.so.
 *
 * Growing structs. The option structs (ks_save_opts, ks_read_opts,
 * ks_load_opts, ks_ckpt_opts, ks_async_opts, ks_torch_read_opts,
 * ks_torch_write_opts) start with `size_t size` (the ks_io table grows by its
 * own `version` member instead: see io.h). New
 * members are only ever appended, and every member's zero is its default.
 * Set size to sizeof(the struct) as your header defines it (KS_OPTS_INIT below
 * does): the library then reads only the members your program knew
 * of and gives the others their defaults, so a program built against an older
 * header keeps working, unchanged and unrebuilt, with a newer library. size 0
 * (plain zero or designated initialisation) means the library's own layout: fine
 * when program and library are built from the same headers, not across
 * upgrades of a shared library. A size the library cannot honour (smaller than
 * the first layout with a size field, or larger with nonzero bytes beyond the
 * members it knows) is refused with KS_E_INVALID.
 * ks_shard_index_info, an output, grows the same way: the library writes only
 * the members the caller's size covers (size 0: the library's own layout).
 * ks_sgd_opts and ks_adamw_opts are hyperparameter values, not options, and
 * do not grow: a new optimizer setting comes with a new create function.
 */
#ifndef KEEPSAKE_EXPORT_H
#define KEEPSAKE_EXPORT_H

/* KS_NODISCARD marks every function returning ks_status: ignoring its result is a
   compiler warning (an error in CI). GCC applies warn_unused_result to functions, not to
   the ks_status typedef, and ignores a (void) cast, so a result that is truly not needed
   must be consumed visibly. C23's [[nodiscard]] is not C11. */
#if defined(__GNUC__) || defined(__clang__)
#define KS_NODISCARD __attribute__((warn_unused_result))
#define KS_API __attribute__((visibility("default")))
#define KS__VISIBILITY_PUSH _Pragma("GCC visibility push(default)")
#define KS__VISIBILITY_PUSH_HIDDEN _Pragma("GCC visibility push(hidden)")
#define KS__VISIBILITY_POP _Pragma("GCC visibility pop")
#else
#define KS_NODISCARD
#define KS_API
#define KS__VISIBILITY_PUSH
#define KS__VISIBILITY_PUSH_HIDDEN
#define KS__VISIBILITY_POP
#endif

/** Initialiser of a growing struct T with size set: `ks_save_opts o = KS_OPTS_INIT(ks_save_opts);`
 *  then assign members. */
#define KS_OPTS_INIT(T) {.size = sizeof(T)}

#ifdef __cplusplus
#define KS_BEGIN_DECLS extern "C" { KS__VISIBILITY_PUSH
#define KS_END_DECLS KS__VISIBILITY_POP }
#define KS_BEGIN_BINDING_DECLS extern "C" { KS__VISIBILITY_PUSH_HIDDEN
#define KS_END_BINDING_DECLS KS__VISIBILITY_POP }
#else
#define KS_BEGIN_DECLS KS__VISIBILITY_PUSH
#define KS_END_DECLS KS__VISIBILITY_POP
#define KS_BEGIN_BINDING_DECLS KS__VISIBILITY_PUSH_HIDDEN
#define KS_END_BINDING_DECLS KS__VISIBILITY_POP
#endif

#endif
