#include "elastic/etcd_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/json.h"
#include "hsdp/env.h"
#include "hsdp/files.h"

namespace hsdp::elastic {
namespace {

using json = nlohmann::json;

const env::IntParam kEtcdTimeoutMs{
    "HSDP_ETCD_TIMEOUT_MS", 5000, 10, 600000,
    "Bound of one request to etcd (elastic/): an endpoint that does not answer within it is an "
    "error naming the endpoint, the operation and the key."};

// libcurl's calls that return a CURLcode.
#define HSDP_CURL_CHECK(call)                                                            \
  do {                                                                                   \
    CURLcode hsdp_curl_rc_ = (call);                                                     \
    if (hsdp_curl_rc_ != CURLE_OK)                                                       \
      return internalError("libcurl: ", #call, ": ", curl_easy_strerror(hsdp_curl_rc_)); \
  } while (0)

std::once_flag g_curl_init;
CURLcode g_curl_init_rc = CURLE_OK;

// etcd's JSON writes int64 as strings; absent means 0 (proto3 leaves zero values out).
int64_t int64Field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_string()) return std::stoll(it->get<std::string>());
  if (it->is_number_integer()) return it->get<int64_t>();
  return 0;
}

StatusOr<KeyValue> parseKv(const json& j) {
  KeyValue kv;
  HSDP_ASSIGN_OR_RETURN(kv.key, base64Decode(j.value("key", "")));
  HSDP_ASSIGN_OR_RETURN(kv.value, base64Decode(j.value("value", "")));
  kv.create_revision = int64Field(j, "create_revision");
  kv.mod_revision = int64Field(j, "mod_revision");
  kv.version = int64Field(j, "version");
  kv.lease = int64Field(j, "lease");
  return kv;
}

StatusOr<RangeResult> parseRange(const json& j) {
  RangeResult r;
  if (j.contains("header")) r.revision = int64Field(j["header"], "revision");
  if (j.contains("kvs")) {
    for (const json& e : j["kvs"]) {
      HSDP_ASSIGN_OR_RETURN(KeyValue kv, parseKv(e));
      r.kvs.push_back(std::move(kv));
    }
  }
  return r;
}

json rangeRequest(const std::string& key, bool prefix) {
  json j = {{"key", base64Encode(key)}};
  if (prefix) j["range_end"] = base64Encode(prefixEnd(key));
  return j;
}

// Where a streamed reply's lines go (the watch).
struct Sink {
  std::string body;
  bool stream = false;
  std::string event_line;  // the first line that carries events
};

size_t onData(char* data, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  sink->body.append(data, size * n);
  if (!sink->stream) return size * n;
  size_t nl;
  while ((nl = sink->body.find('\n')) != std::string::npos) {
    std::string line = sink->body.substr(0, nl);
    sink->body.erase(0, nl + 1);
    StatusOr<json> parsed = hsdp::parseJson(line, "etcd watch");
    if (!parsed.ok()) continue;
    const json& j = *parsed;
    const json& r = j.contains("result") ? j["result"] : j;
    if (j.contains("error") || (r.contains("events") && !r["events"].empty()) ||
        r.value("canceled", false)) {
      sink->event_line = line;
      return 0;  // ends the transfer (CURLE_WRITE_ERROR): the wait is over
    }
  }
  return size * n;
}

}  // namespace

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::create(std::string endpoint, Options options) {
  std::vector<std::string> endpoints;
  for (size_t at = 0; at <= endpoint.size();) {
    size_t comma = std::min(endpoint.find(',', at), endpoint.size());
    std::string one = endpoint.substr(at, comma - at);
    at = comma + 1;
    if (one.rfind("http://", 0) != 0 && one.rfind("https://", 0) != 0)
      return invalidArgument("etcd endpoint '", one, "' is not http://host:port",
                             one == endpoint ? "" : strCat(" (in '", endpoint, "')"));
    while (!one.empty() && one.back() == '/') one.pop_back();
    if (std::find(endpoints.begin(), endpoints.end(), one) != endpoints.end())
      return invalidArgument("etcd endpoint '", one, "' is named twice in '", endpoint, "'");
    endpoints.push_back(std::move(one));
  }
  std::string joined;
  for (const std::string& e : endpoints) joined += (joined.empty() ? "" : ",") + e;
  int64_t timeout_ms = options.timeout_ms;
  if (timeout_ms <= 0) {
    HSDP_ASSIGN_OR_RETURN(timeout_ms, kEtcdTimeoutMs.value());
  }
  std::call_once(g_curl_init, [] { g_curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); });
  HSDP_CURL_CHECK(g_curl_init_rc);
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return internalError("libcurl: curl_easy_init failed");
  return std::unique_ptr<EtcdClient>(
      new EtcdClient(std::move(joined), std::move(endpoints), timeout_ms, curl));
}

EtcdClient::EtcdClient(std::string endpoint, std::vector<std::string> endpoints, int64_t timeout_ms,
                       void* curl)
    : endpoint_(std::move(endpoint)),
      endpoints_(std::move(endpoints)),
      timeout_ms_(timeout_ms),
      curl_(curl) {}

EtcdClient::~EtcdClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

EtcdClient::Cost EtcdClient::cost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cost_;
}

StatusOr<std::string> EtcdClient::post(const std::string& path, const std::string& body,
                                       const std::string& op, const std::string& key,
                                       int64_t timeout_ms, bool stream_until_event) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto t0 = std::chrono::steady_clock::now();
  struct Count {  // the exchange's time, on every way out
    EtcdClient* c;
    std::chrono::steady_clock::time_point t0;
    bool watch;
    ~Count() {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      (watch ? c->cost_.watch_s : c->cost_.request_s) += s;
    }
  } count{this, t0, stream_until_event};
  if (endpoints_.size() == 1) {  // one endpoint: its own error, as it always was
    ++(stream_until_event ? cost_.watches : cost_.requests);
    bool retry = false;
    return postTo(endpoints_[0], path, body, op, key, timeout_ms, stream_until_event, &retry);
  }
  // Members in turn from the one that answered last, rounds until the budget is spent (a
  // leader's election takes a round or two): each member's last error is kept for the message.
  const size_t n = endpoints_.size();
  const auto deadline =
      t0 + std::chrono::milliseconds(stream_until_event ? timeout_ms : timeout_ms * int64_t(n));
  std::vector<std::string> last(n, "not tried");
  for (int round = 0;; ++round) {
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (current_ + k) % n;
      const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                               deadline - std::chrono::steady_clock::now())
                               .count();
      if (left <= 0 && round > 0) break;
      ++(stream_until_event ? cost_.watches : cost_.requests);
      bool retry = false;
      StatusOr<std::string> r =
          postTo(endpoints_[i], path, body, op, key,
                 std::max<int64_t>(1, std::min(timeout_ms, left)), stream_until_event, &retry);
      if (r.ok() || !retry) {
        current_ = i;
        return r;
      }
      last[i] = r.status().message();
    }
    if (std::chrono::steady_clock::now() + std::chrono::milliseconds(100) >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::string tried;
  for (size_t i = 0; i < n; ++i) tried += strCat(i == 0 ? "" : "; ", last[i]);
  return internalError("etcd ", endpoint_, ": the coordinator lost its quorum: no member of the ",
                       n, " answered ", op, " '", key, "' (", tried, ")");
}

StatusOr<std::string> EtcdClient::postTo(const std::string& endpoint, const std::string& path,
                                         const std::string& body, const std::string& op,
                                         const std::string& key, int64_t timeout_ms,
                                         bool stream_until_event, bool* retry) {
  CURL* curl = static_cast<CURL*>(curl_);
  auto where = [&] { return strCat("etcd ", endpoint, ": ", op, " '", key, "'"); };
  curl_easy_reset(curl);
  std::string url = endpoint + path;
  Sink sink;
  sink.stream = stream_until_event;
  struct Headers {
    curl_slist* list = nullptr;
    ~Headers() { curl_slist_free_all(list); }
  } headers;
  headers.list = curl_slist_append(nullptr, "Content-Type: application/json");
  // A watch on a member cut off from the leader is canceled ("no leader"), not left silent.
  if (stream_until_event)
    headers.list = curl_slist_append(headers.list, "Grpc-Metadata-hasleader: true");
  HSDP_CURL_CHECK(curl_easy_setopt(curl, CURLOPT_URL, url.c_str()));
  HSDP_CURL_CHECK(curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.list));
  HSDP_CURL_CHECK(curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str()));
  HSDP_CURL_CHECK(curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size())));
  HSDP_CURL_CHECK(curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms)));
  HSDP_CURL_CHECK(curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                                   static_cast<long>(std::min(timeout_ms, timeout_ms_))));
  HSDP_CURL_CHECK(curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L));  // threads: no SIGALRM
  HSDP_CURL_CHECK(curl_easy_setopt(curl, CURLOPT_PROXY, ""));     // etcd is reached directly
  HSDP_CURL_CHECK(curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &onData));
  HSDP_CURL_CHECK(curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink));
  CURLcode rc = curl_easy_perform(curl);
  if (stream_until_event) {
    if (!sink.event_line.empty()) {
      // Canceled for want of a leader (this member is in the minority): another may serve it.
      *retry = sink.event_line.find("no leader") != std::string::npos;
      if (*retry) return internalError(where(), ": the watch was canceled: no leader");
      return sink.event_line;
    }
    if (rc == CURLE_OPERATION_TIMEDOUT) {
      long http = 0;
      curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
      if (http == 200) return std::string();  // watching, nothing changed
    }
  }
  if (rc != CURLE_OK) {
    *retry = true;  // no connection, or no (complete) reply: another member may answer
    return internalError(
        where(), " failed: ", curl_easy_strerror(rc),
        rc == CURLE_OPERATION_TIMEDOUT ? strCat(" (bound ", timeout_ms, " ms)") : std::string());
  }
  long http = 0;
  HSDP_CURL_CHECK(curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http));
  if (http != 200) {
    StatusOr<json> pj = hsdp::parseJson(sink.body, where());
    json j = pj.ok() ? std::move(*pj) : json(json::value_t::discarded);
    // gRPC UNAVAILABLE (14; HTTP 503): no leader, the request timed out in raft, the leader
    // changed: this member cannot serve it now, another may.
    if (http == 503 || (!j.is_discarded() && j.is_object() && j.value("code", 0) == 14)) {
      *retry = true;
      return internalError(where(), ": HTTP ", http, ": ",
                           files::quote(j.is_object() ? j.value("message", sink.body) : sink.body));
    }
    // The gateway's gRPC error ({"error", "code", "message"}): the caller reads the code.
    if (!stream_until_event && !j.is_discarded() && j.is_object() && j.contains("error"))
      return std::move(sink.body);
    std::string msg =
        (!j.is_discarded() && j.is_object() && j.contains("message") && j["message"].is_string())
            ? j["message"].get<std::string>()
            : sink.body;
    msg = files::quote(msg);
    if (stream_until_event) return internalError(where(), ": the watch ended: HTTP ", http);
    return internalError(where(), ": HTTP ", http, ": ", msg);
  }
  if (stream_until_event) return internalError(where(), ": the watch stream ended");
  return std::move(sink.body);
}

namespace {
// The reply as JSON; an error field (the gateway's gRPC status) is an error naming the request.
StatusOr<json> parseReply(const std::string& body, const std::string& where) {
  StatusOr<json> parsed = hsdp::parseJson(body, where);
  if (!parsed.ok() || !parsed->is_object())
    return internalError(where, ": not JSON: '", files::quote(body), "'");
  json j = std::move(*parsed);
  if (j.contains("error")) {
    const json& e = j["error"];
    std::string msg = e.is_object() ? e.value("message", e.dump()) : e.dump();
    if (j.contains("message") && j["message"].is_string()) msg = j["message"];
    return internalError(where, ": ", msg);
  }
  return j;
}
}  // namespace

StatusOr<int64_t> EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  json req = {{"key", base64Encode(key)}, {"value", base64Encode(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  HSDP_ASSIGN_OR_RETURN(std::string body,
                        post("/v3/kv/put", req.dump(), "put", key, timeout_ms_, false));
  HSDP_ASSIGN_OR_RETURN(json j, parseReply(body, strCat("etcd ", endpoint_, ": put '", key, "'")));
  return j.contains("header") ? int64Field(j["header"], "revision") : 0;
}

StatusOr<std::optional<KeyValue>> EtcdClient::get(const std::string& key) {
  HSDP_ASSIGN_OR_RETURN(std::string body, post("/v3/kv/range", rangeRequest(key, false).dump(),
                                               "get", key, timeout_ms_, false));
  HSDP_ASSIGN_OR_RETURN(json j, parseReply(body, strCat("etcd ", endpoint_, ": get '", key, "'")));
  HSDP_ASSIGN_OR_RETURN(RangeResult r, parseRange(j));
  if (r.kvs.empty()) return std::optional<KeyValue>();
  return std::optional<KeyValue>(std::move(r.kvs.front()));
}

StatusOr<RangeResult> EtcdClient::getPrefix(const std::string& prefix) {
  HSDP_ASSIGN_OR_RETURN(std::string body, post("/v3/kv/range", rangeRequest(prefix, true).dump(),
                                               "range", prefix, timeout_ms_, false));
  HSDP_ASSIGN_OR_RETURN(json j,
                        parseReply(body, strCat("etcd ", endpoint_, ": range '", prefix, "'")));
  return parseRange(j);
}

StatusOr<int64_t> EtcdClient::del(const std::string& key, bool prefix) {
  HSDP_ASSIGN_OR_RETURN(std::string body,
                        post("/v3/kv/deleterange", rangeRequest(key, prefix).dump(), "delete", key,
                             timeout_ms_, false));
  HSDP_ASSIGN_OR_RETURN(json j,
                        parseReply(body, strCat("etcd ", endpoint_, ": delete '", key, "'")));
  return int64Field(j, "deleted");
}

StatusOr<TxnResult> EtcdClient::txn(const std::vector<Compare>& compares,
                                    const std::vector<Op>& success,
                                    const std::vector<Op>& failure) {
  static const char* kTargets[] = {"CREATE", "MOD", "VERSION", "VALUE"};
  static const char* kFields[] = {"create_revision", "mod_revision", "version", "value"};
  static const char* kResults[] = {"EQUAL", "NOT_EQUAL", "GREATER", "LESS"};
  json cmp = json::array();
  for (const Compare& c : compares) {
    int t = static_cast<int>(c.target);
    json e = {{"key", base64Encode(c.key)},
              {"target", kTargets[t]},
              {"result", kResults[static_cast<int>(c.result)]}};
    if (c.target == Compare::Target::kValue) {
      e[kFields[t]] = base64Encode(c.value);
    } else {
      e[kFields[t]] = std::to_string(c.number);
    }
    cmp.push_back(std::move(e));
  }
  auto ops = [](const std::vector<Op>& list) {
    json a = json::array();
    for (const Op& op : list) {
      if (op.kind == Op::Kind::kPut) {
        json p = {{"key", base64Encode(op.key)}, {"value", base64Encode(op.value)}};
        if (op.lease != 0) p["lease"] = std::to_string(op.lease);
        a.push_back({{"request_put", p}});
      } else if (op.kind == Op::Kind::kGet) {
        a.push_back({{"request_range", rangeRequest(op.key, op.prefix)}});
      } else {
        a.push_back({{"request_delete_range", rangeRequest(op.key, op.prefix)}});
      }
    }
    return a;
  };
  json req = {{"compare", cmp}, {"success", ops(success)}, {"failure", ops(failure)}};
  std::string first = !compares.empty()  ? compares.front().key
                      : !success.empty() ? success.front().key
                                         : std::string();
  HSDP_ASSIGN_OR_RETURN(std::string body,
                        post("/v3/kv/txn", req.dump(), "txn", first, timeout_ms_, false));
  HSDP_ASSIGN_OR_RETURN(json j,
                        parseReply(body, strCat("etcd ", endpoint_, ": txn '", first, "'")));
  TxnResult r;
  r.succeeded = j.value("succeeded", false);
  if (j.contains("header")) r.revision = int64Field(j["header"], "revision");
  if (j.contains("responses")) {
    for (const json& resp : j["responses"]) {
      if (!resp.contains("response_range")) continue;
      HSDP_ASSIGN_OR_RETURN(RangeResult range, parseRange(resp["response_range"]));
      range.revision = r.revision;  // every range of a txn reads the same revision
      r.ranges.push_back(std::move(range));
    }
  }
  return r;
}

StatusOr<int64_t> EtcdClient::leaseGrant(int64_t ttl_s) {
  if (ttl_s <= 0) return invalidArgument("etcd ", endpoint_, ": lease TTL ", ttl_s, " s");
  json req = {{"TTL", std::to_string(ttl_s)}};
  std::string what = strCat("TTL ", ttl_s, " s");
  HSDP_ASSIGN_OR_RETURN(std::string body, post("/v3/lease/grant", req.dump(), "lease grant", what,
                                               timeout_ms_, false));
  HSDP_ASSIGN_OR_RETURN(json j, parseReply(body, strCat("etcd ", endpoint_, ": lease grant")));
  int64_t id = int64Field(j, "ID");
  if (id == 0) return internalError("etcd ", endpoint_, ": lease grant: no ID in '", body, "'");
  return id;
}

StatusOr<int64_t> EtcdClient::leaseKeepAlive(int64_t lease) {
  json req = {{"ID", std::to_string(lease)}};
  std::string id = std::to_string(lease);
  HSDP_ASSIGN_OR_RETURN(std::string body, post("/v3/lease/keepalive", req.dump(), "lease keepalive",
                                               id, timeout_ms_, false));
  // One message per request: the stream ends with the request's body.
  std::string line = body.substr(0, body.find('\n'));
  HSDP_ASSIGN_OR_RETURN(
      json j, parseReply(line, strCat("etcd ", endpoint_, ": lease keepalive '", id, "'")));
  const json& r = j.contains("result") ? j["result"] : j;
  int64_t ttl = int64Field(r, "TTL");
  if (ttl <= 0) return notFound("etcd ", endpoint_, ": lease keepalive '", id, "': expired");
  return ttl;
}

Status EtcdClient::leaseRevoke(int64_t lease) {
  json req = {{"ID", std::to_string(lease)}};
  std::string id = std::to_string(lease);
  HSDP_ASSIGN_OR_RETURN(std::string body, post("/v3/lease/revoke", req.dump(), "lease revoke", id,
                                               timeout_ms_, false));
  StatusOr<json> pj = hsdp::parseJson(body, "etcd lease revoke");
  json j = pj.ok() ? std::move(*pj) : json(json::value_t::discarded);
  // gRPC NOT_FOUND (5): the lease expired already, which is what revoking wants.
  if (!j.is_discarded() && j.is_object() && j.contains("error") && j.value("code", 0) == 5)
    return okStatus();
  return parseReply(body, strCat("etcd ", endpoint_, ": lease revoke '", id, "'")).status();
}

StatusOr<WatchResult> EtcdClient::waitForChange(const std::string& prefix, int64_t from_revision,
                                                int64_t timeout_ms) {
  json create = rangeRequest(prefix, true);
  create["start_revision"] = std::to_string(from_revision);
  json req = {{"create_request", create}};
  WatchResult out;
  out.next_revision = from_revision;
  HSDP_ASSIGN_OR_RETURN(std::string line, post("/v3/watch", req.dump(), "watch", prefix,
                                               std::max<int64_t>(timeout_ms, 1), true));
  if (line.empty()) {
    out.timed_out = true;
    return out;
  }
  std::string where = strCat("etcd ", endpoint_, ": watch '", prefix, "'");
  HSDP_ASSIGN_OR_RETURN(json j, parseReply(line, where));
  const json& r = j.contains("result") ? j["result"] : j;
  if (r.value("canceled", false)) {
    // A start revision older than the compacted one: the changes since are lost to a watch.
    return failedPrecondition(where, ": canceled from revision ", from_revision, ": ",
                              r.value("cancel_reason", "?"), " (compact revision ",
                              int64Field(r, "compact_revision"), ")");
  }
  for (const json& e : r["events"]) {
    WatchEvent ev;
    ev.type =
        e.value("type", "PUT") == "DELETE" ? WatchEvent::Type::kDelete : WatchEvent::Type::kPut;
    HSDP_ASSIGN_OR_RETURN(ev.kv, parseKv(e["kv"]));
    out.next_revision = std::max(out.next_revision, ev.kv.mod_revision + 1);
    out.events.push_back(std::move(ev));
  }
  return out;
}

}  // namespace hsdp::elastic
