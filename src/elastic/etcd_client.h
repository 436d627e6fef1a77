// A client for an etcd cluster (etcd 3.4 or later) over its v3 JSON gateway: the v3 API as
// JSON over HTTP (POST /v3/kv/range, /v3/kv/put, /v3/kv/deleterange, /v3/kv/txn,
// /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke, /v3/watch), keys and values base64 in
// the body, int64 fields as JSON strings. libcurl carries it: no gRPC or protobuf code
// generation. docs/elastic.md describes what the quorum keeps in etcd.
//
// Every call is bounded: a request that etcd does not answer within the client's timeout (or an
// endpoint that does not accept the connection) is an error naming the endpoint, the operation
// and the key. One client holds one libcurl handle and serialises its calls (a mutex): give each
// thread that must not wait on another its own client.
//
// Several endpoints ("http://a:2379,http://b:2379,http://c:2379", the members of one cluster):
// a request goes to the member that last answered; one that refuses the connection, drops it,
// does not answer within the bound, or answers that it cannot serve (no leader, timed out,
// unavailable) is failed over to the next member, each in turn, once. Every request is one HTTP
// exchange, so a lease's keepalive goes through whichever member answers and a watch (one long
// poll per waitForChange) is re-established on the next member. Reads are etcd's default,
// linearizable (served through the leader); a watch asks for a leader ("hasleader" metadata), so
// a member cut off from the majority cancels it instead of staying silent. A request sent to a
// member that died before answering may have been applied: the quorum's writes are transactions
// guarded by comparisons (docs/elastic.md), which makes their repetition harmless. When no
// member answers, the error names every endpoint tried and why each failed.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "hsdp/status.h"

namespace hsdp::elastic {

// One key as etcd holds it. Revisions are etcd's: create_revision is the revision of the put
// that created the key (a new one each time it is created again), mod_revision that of its last
// change, version the number of changes since its creation.
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;  // 0: none
};

// The keys of a range read and the store's revision when it was read.
struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;
};

// One comparison of a transaction: key's <target> <result> <number or value>. A key that does
// not exist has create_revision, mod_revision and version 0.
struct Compare {
  enum class Target { kCreateRevision, kModRevision, kVersion, kValue };
  enum class Result { kEqual, kNotEqual, kGreater, kLess };
  std::string key;
  Target target = Target::kCreateRevision;
  Result result = Result::kEqual;
  int64_t number = 0;  // revisions and version
  std::string value;   // kValue

  static Compare absent(std::string key);                        // create_revision == 0
  static Compare createdAt(std::string key, int64_t revision);   // create_revision == revision
  static Compare valueIs(std::string key, std::string value);    // value == value
  static Compare versionIs(std::string key, int64_t version);    // version == version
  static Compare modifiedAt(std::string key, int64_t revision);  // mod_revision == revision
};

// One operation of a transaction's branch.
struct Op {
  enum class Kind { kPut, kGet, kDelete };
  Kind kind = Kind::kGet;
  std::string key;
  std::string value;    // kPut
  int64_t lease = 0;    // kPut
  bool prefix = false;  // kGet, kDelete: every key that starts with `key`

  static Op put(std::string key, std::string value, int64_t lease = 0);
  static Op get(std::string key, bool prefix = false);
  static Op del(std::string key, bool prefix = false);
};

// What a transaction did: which branch ran, the revision after it, and one RangeResult per kGet
// of that branch, in order.
struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;
  std::vector<RangeResult> ranges;
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // a delete carries the key and the revision of the delete (mod_revision)
};

// What waitForChange saw: the events (empty when it timed out) and the revision to watch from
// next (one past the last event's, or the start revision when nothing changed).
struct WatchResult {
  std::vector<WatchEvent> events;
  int64_t next_revision = 0;
  bool timed_out = false;
};

class EtcdClient {
 public:
  struct Options {
    // Each request's bound; <= 0: HSDP_ETCD_TIMEOUT_MS.
    int64_t timeout_ms = 0;
  };

  // A client for `endpoint` ("http://host:port", or a comma list of a cluster's members). Nothing
  // is sent yet: an unreachable endpoint is the first call's error.
  static StatusOr<std::unique_ptr<EtcdClient>> create(std::string endpoint, Options options);
  static StatusOr<std::unique_ptr<EtcdClient>> create(std::string endpoint) {
    return create(std::move(endpoint), Options{});
  }
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The endpoints as given (comma-separated when several).
  const std::string& endpoint() const { return endpoint_; }
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  int64_t timeoutMs() const { return timeout_ms_; }

  // What this client's requests cost so far (the quorum's per-step report): how many HTTP
  // exchanges (a failed-over request counts once per member tried) and their wall time, the
  // watches' waits apart (they wait for other groups, not for etcd).
  struct Cost {
    int64_t requests = 0;
    double request_s = 0;
    int64_t watches = 0;
    double watch_s = 0;
  };
  Cost cost() const;

  // Sets `key` to `value`, attached to `lease` when it is not 0. Returns the new revision.
  StatusOr<int64_t> put(const std::string& key, const std::string& value, int64_t lease = 0);
  // The key, or nullopt when it does not exist.
  StatusOr<std::optional<KeyValue>> get(const std::string& key);
  // Every key that starts with `prefix`, in key order, and the revision read.
  StatusOr<RangeResult> getPrefix(const std::string& prefix);
  // Deletes `key` (or every key under it with prefix); returns how many were deleted.
  StatusOr<int64_t> del(const std::string& key, bool prefix = false);
  // If every comparison holds, the success ops, else the failure ops: one atomic step.
  StatusOr<TxnResult> txn(const std::vector<Compare>& compares, const std::vector<Op>& success,
                          const std::vector<Op>& failure);

  // A lease of `ttl_s` seconds; returns its ID.
  StatusOr<int64_t> leaseGrant(int64_t ttl_s);
  // Refreshes the lease once; returns its TTL. A lease that expired (or was revoked): NotFound.
  StatusOr<int64_t> leaseKeepAlive(int64_t lease);
  // Revokes the lease, deleting its keys. A lease that is already gone is not an error.
  Status leaseRevoke(int64_t lease);

  // Blocks until a key under `prefix` changes at or after `from_revision`, or `timeout_ms`
  // passes (timed_out, no events; not an error). Streams the gateway's /v3/watch: the first
  // message of events ends the wait. A timeout_ms beyond the request bound is allowed here.
  StatusOr<WatchResult> waitForChange(const std::string& prefix, int64_t from_revision,
                                      int64_t timeout_ms);

 private:
  EtcdClient(std::string endpoint, std::vector<std::string> endpoints, int64_t timeout_ms,
             void* curl);
  // One exchange with one member: `endpoint`'s reply, or an error naming it. *retry: true when
  // another member may answer (no connection, no reply, or etcd's "cannot serve now").
  StatusOr<std::string> postTo(const std::string& endpoint, const std::string& path,
                               const std::string& body, const std::string& op,
                               const std::string& key, int64_t timeout_ms, bool stream_until_event,
                               bool* retry);
  // POSTs `body` to `path`; the reply's body. `op` and `key` name the request in errors. With
  // `stream_until_event`, the reply is a stream of JSON lines and the first line that carries
  // watch events ends it; a timeout then returns "" instead of an error.
  StatusOr<std::string> post(const std::string& path, const std::string& body,
                             const std::string& op, const std::string& key, int64_t timeout_ms,
                             bool stream_until_event);

  std::string endpoint_;
  std::vector<std::string> endpoints_;
  size_t current_ = 0;  // the member that answered last
  int64_t timeout_ms_;
  void* curl_;  // CURL*
  mutable std::mutex mu_;
  Cost cost_;
};

// The end of the prefix range that starts with `prefix` (etcd's range_end): `prefix` with its
// last byte incremented (trailing 0xff bytes dropped).
std::string prefixEnd(const std::string& prefix);
std::string base64Encode(const std::string& in);
// Fails on characters outside the alphabet or a bad length.
StatusOr<std::string> base64Decode(const std::string& in);

}  // namespace hsdp::elastic
