/**
 * @file storage.h
 * Storage locations: a plain path, `file://...`, `s3://bucket/prefix` or
 * `http(s)://host/path`, opened as a ks_io table (io.h) plus the path to use
 * with it. Every part of the library that takes a ks_io (ks_save_opts.io,
 * ks_read_opts.io, ks_ckpt_opts.io, ...) then works on that location:
 *
 *     ks_storage *st;
 *     if (ks_storage_open("s3://bucket/run", NULL, &st, &err)) ...;
 *     ks_ckpt_opts co = {.run_dir = ks_storage_path(st), .io = ks_storage_io(st)};
 *
 * The remote backends need libcurl (CMake option KS_WITH_CURL); a build without
 * it opens only local locations and refuses the others with KS_E_UNSUPPORTED.
 *
 * S3. Credentials come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
 * AWS_SESSION_TOKEN (optional); requests are signed with AWS Signature V4
 * (libcurl's own signer) with the payload declared UNSIGNED-PAYLOAD (the body
 * is sent over the connection the signature protects; use https for integrity
 * in transit; keepsake files carry their own checksums).
 * An object is written in one piece: the table stages the bytes of a file the
 * library writes in memory and uploads them only when the library renames the
 * temporary file onto its final name, with one PUT, or above the multipart
 * threshold as a multipart upload whose parts go in parallel and which is
 * aborted on failure. A name therefore never shows a partial object. A
 * symbolic link (`latest`) becomes a small pointer object (docs/FORMAT.md).
 * Failed requests are retried with exponential backoff and jitter on 5xx,
 * 429, timeouts, resets and short bodies.
 *
 * HTTP(S) is read-only: opening (HEAD) and ranged reads (Range GET); writes
 * fail with EROFS, listing with ENOTSUP.
 *
 * Validators. Opening an object (HEAD) keeps the validator the server gives,
 * its ETag, else its Last-Modified; the table's validator_fn (io.h) reports
 * it, so a read cache (io_cache.h) never serves an object replaced on the
 * server from the pieces of the one before. With a strong ETag, every ranged
 * read of the handle carries `If-Match`: an object replaced while it is open
 * fails the read with ESTALE ("the object changed since it was opened")
 * instead of giving bytes of two objects.
 *
 * Locks (S3). The table has KS_IO_CAP_LOCK: the checkpoint manager's run
 * directory lock (lock_fn on run_dir/.keepsake.lock) is a lease object at that
 * key, JSON naming its holder (the manager's "pid N on host H since T" line,
 * host, pid, boot id, pid namespace) and its time to live
 * (ks_storage_opts.lock_ttl_ms, 1 min). It is created with a conditional
 * write (PUT with `If-None-Match: *`): of two managers only one can, and the
 * other reads the lease and gets EWOULDBLOCK with the holder (KS_E_LOCKED from
 * the manager). While held, a thread of the storage object rewrites it every
 * third of its time to live with `If-Match: <its own last ETag>` (an upload
 * into the run directory renews an overdue one too), and unlock_fn deletes it
 * with `If-Match`. A lease not renewed for its time to live, measured on the
 * server's clock (Date minus Last-Modified, 1 s slack), or held by a process of
 * this machine (same host name, boot and pid namespace) that no longer exists,
 * is taken over with a PUT conditional on the ETag read, then read back. A
 * holder whose lease was taken over (or removed) meanwhile uploads nothing more
 * under the run directory: rename_fn there fails with ENOLCK. A store that
 * ignores conditional writes (a second `If-None-Match: *` PUT of one key
 * succeeds) or refuses them (501) has no locks: lock_fn returns ENOTSUP, so the
 * manager runs unlocked under KS_CKPT_LOCK_AUTO and refuses under
 * KS_CKPT_LOCK_REQUIRE. A negative lock_ttl_ms removes the capability.
 *
 * Deadlines and budgets. A hostile or dying server can neither hang a program
 * nor make it hold unbounded memory:
 *   - every remote operation has an overall deadline (ks_storage_opts.deadline_ms),
 *     the whole of its retries and backoff included: one request with its
 *     retries (HEAD, a pointer GET, a PUT, a DELETE, a copy), a whole listing
 *     (every page), the requests of one open (a pointer and its target), and
 *     each part of a multipart upload or of a parallel ranged read (so a big
 *     transfer is bounded per part, not cut at a fixed total). Past it the table
 *     returns ETIMEDOUT, a server that sends 1 byte every few seconds included;
 *   - a listing has a total budget of pages, entries and answer bytes
 *     (list_max_pages, list_max_keys, list_max_bytes); past one the table
 *     returns EOVERFLOW (a listing that never ends is an error, not a hang);
 *   - an answer bigger than what was asked (a Content-Length or a body longer
 *     than the range requested, a Content-Range other than the one asked, an
 *     object size above S3's 5 TiB) is refused at once with EFBIG, before its
 *     body is kept; a ranged read never writes past the caller's buffer.
 * The message of ks_storage_last_error() names the URL and the limit (e.g.
 * "deadline of 3000 ms (ks_storage_opts.deadline_ms) exceeded"), and
 * ks_storage_last_status() classifies it: KS_E_NET for the deadline and
 * network failures, KS_E_LIMIT for a budget or an answer over its cap.
 *
 * Pointers. Opening a pointer object (open_fn, so ks_reader_open, ks_load and
 * the CLI on `s3://bucket/run/latest`) follows it to the object it names, as
 * open(2) follows a symbolic link (at most 8 pointers in a row, else ELOOP);
 * stat_fn still reports the pointer itself (KS_IO_LINK), as lstat(2) does.
 *
 * Errors. The table returns errno values as io.h requires (404: ENOENT, 403
 * and 401: EACCES, 5xx and network failures after the retries: EIO, ...), and
 * its detail_fn gives the calling thread the detail of its own failed call,
 * which the library adds to its messages: e.g. "cannot rename into place
 * temporary file 'run/.x.tmp-AbC123': Connection refused (PUT s3://b/run/x at
 * endpoint http://127.0.0.1:9: Failed to connect ... after 5 retries)".
 * ks_storage_last_error() gives the detail (URL, HTTP status, S3 error code
 * and message) of the storage object's last failure, whatever thread it was.
 */
#ifndef KEEPSAKE_STORAGE_H
#define KEEPSAKE_STORAGE_H

#include "keepsake/export.h"

#include <stddef.h>
#include <stdint.h>

#include "keepsake/alloc.h"
#include "keepsake/io.h"
#include "keepsake/status.h"

KS_BEGIN_DECLS

/**
 * How to open a storage location; zero-initialise (or KS_OPTS_INIT), then set
 * what you need. A growing struct ("Growing structs" in export.h): members are
 * only ever appended, each one's zero is its default, and a program built with
 * an older, shorter layout (its `size`) gets the defaults of the newer members.
 */
typedef struct ks_storage_opts {
  size_t size;               /**< 0 or sizeof(this struct): see "Growing structs" in export.h */
  const ks_allocator *alloc; /**< NULL: malloc/free; used for the storage object and its buffers */
  const char *endpoint;      /**< S3 endpoint URL; NULL: $AWS_ENDPOINT_URL, else https://s3.<region>.amazonaws.com */
  const char *region;        /**< NULL: $AWS_REGION, else "us-east-1" */
  int path_style;            /**< S3: 1 endpoint/bucket/key, -1 virtual host bucket.endpoint/key, 0 default
                                  (path style when an endpoint is given, else virtual host) */
  unsigned max_retries;      /**< retries of a failed request; 0: 5 */
  unsigned retry_base_ms;    /**< first backoff (doubled per retry, with jitter); 0: 100 */
  long timeout_ms;           /**< one attempt's timeout (then retried); 0: none (a stalled transfer is caught by the
                                  low-speed limit, 30 s without a byte); deadline_ms bounds all attempts together */
  long connect_timeout_ms;   /**< 0: 10000 */
  uint64_t multipart_threshold; /**< S3 objects of at least this size go by multipart upload; 0: 64 MiB */
  uint64_t part_size;        /**< multipart part size; 0: 16 MiB; at least 5 MiB (S3's minimum) unless testing */
  unsigned parallel;         /**< multipart parts in flight; 0: 4 */
  /* --- appended after the first layout (read only when `size` covers them; 0 is the default) --- */
  long deadline_ms;          /**< overall limit of one remote operation, retries and backoff included
                                  (see "Deadlines and budgets" below); 0: 300000 (5 min); negative: none */
  uint64_t list_max_pages;   /**< most pages one listing may take; 0: 10000 */
  uint64_t list_max_keys;    /**< most entries one listing may return, over all its pages; 0: 1000000 */
  uint64_t list_max_bytes;   /**< most answer bytes one listing may read, over all its pages; 0: 1 GiB */
  long lock_ttl_ms;          /**< S3: how long a run directory lock (a lease, see "Locks" above) lasts without
                                  renewal, so a dead holder's is taken over; renewed every third of it;
                                  0: 60000 (1 min); negative: no locks (the table lacks KS_IO_CAP_LOCK) */
} ks_storage_opts;

/** An open storage location (opaque). */
typedef struct ks_storage ks_storage;

/**
 * Opens a location: a plain path or `file://path` (the local file system,
 * ks_io_posix()), `s3://bucket[/prefix]`, or `http://` / `https://` URLs
 * (read-only). No request is made: a missing bucket or host shows at the first
 * operation.
 * @param location the location (copied)
 * @param opts     NULL for the defaults
 * @param out      receives the storage object, to be freed with ks_storage_free()
 * @return KS_OK; KS_E_INVALID (empty location or path, bad bucket name, bad
 * options); KS_E_UNSUPPORTED (an unknown scheme, or a remote one in a build
 * without libcurl); KS_E_NET (libcurl could not be initialised); KS_E_NOMEM.
 * Thread safety: may be called from any thread (libcurl's global
 * initialisation runs once, guarded).
 */
KS_NODISCARD ks_status ks_storage_open(const char *location, const ks_storage_opts *opts, ks_storage **out,
                                       ks_error *err);

/**
 * The I/O table for this location, to pass wherever the library takes a
 * `const ks_io *`. Owned by st: valid until ks_storage_free(st).
 * Thread safety: the table's functions are thread safe (a manager's background
 * save and parallel reads may use it at the same time).
 */
const ks_io *ks_storage_io(const ks_storage *st);

/**
 * The path to use with ks_storage_io(): the local path for a local location;
 * for S3 the key prefix (without trailing '/', "." for the bucket's root), for
 * HTTP the URL itself. Paths the library derives from it ("<path>/name") map
 * to "<prefix>/name" keys or "<url>/name" URLs. Owned by st.
 */
const char *ks_storage_path(const ks_storage *st);

/** Nonzero for an S3 or HTTP location, 0 for a local one (or NULL). */
int ks_storage_is_remote(const ks_storage *st);

/** Nonzero when the location cannot be written (HTTP). */
int ks_storage_is_read_only(const ks_storage *st);

/**
 * Copies the detail of the table's most recent failure (any thread), e.g.
 * "PUT http://127.0.0.1:5000/b/run/x: HTTP 503 (SlowDown: Please reduce your
 * request rate) after 5 retries", into buf (cap bytes, NUL-terminated,
 * truncated to fit).
 * @return the length of the full message; 0 (and "") when nothing failed yet.
 * Thread safety: safe; with concurrent failures, one of them.
 */
size_t ks_storage_last_error(const ks_storage *st, char *buf, size_t cap);

/**
 * The table's most recent failure (any thread) as a status, with its detail in
 * err (the message of ks_storage_last_error(), which names the URL).
 * @return KS_OK when nothing failed yet (err untouched); KS_E_NET for a deadline
 * that ran out, a timeout or another network failure after the retries;
 * KS_E_LIMIT for a listing budget or an answer over its cap; KS_E_IO for any
 * other failure of the store (an HTTP error status, a malformed answer).
 * The library's own messages carry only strerror() of the table's errno, and
 * report a table's failure as KS_E_IO: a program that wants to tell a dead
 * network from a bad file asks this after a failed call.
 * Thread safety: safe; with concurrent failures, one of them.
 */
KS_NODISCARD ks_status ks_storage_last_status(const ks_storage *st, ks_error *err);

/** Frees st (NULL accepted). No operation of its table may be running or follow. */
void ks_storage_free(ks_storage *st);

KS_END_DECLS
#endif
