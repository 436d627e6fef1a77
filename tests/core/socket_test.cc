// core/socket.h on loopback: connect deadlines, read timeouts, a peer closing mid-message, a
// large write-all, accept deadlines and address parsing, each error naming the peer and the time.
#include "core/socket.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace hsdp::net {
namespace {

using std::chrono::milliseconds;

bool has(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

int64_t msSince(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t).count();
}

sockaddr_in loopback(int port) { return ipv4(htonl(INADDR_LOOPBACK), static_cast<uint16_t>(port)); }

// A listener on 127.0.0.1 and one connection to it, both ends.
struct Pair {
  Listening l;
  Fd client, server;
};
Pair connected() {
  Pair p;
  StatusOr<Listening> l = listenOn(loopback(0), 4);
  EXPECT_TRUE(l.ok()) << l.status().toString();
  p.l = std::move(*l);
  StatusOr<Fd> c = connectTo(loopback(p.l.port), "the test server", after(2000));
  EXPECT_TRUE(c.ok()) << c.status().toString();
  StatusOr<Fd> s = acceptBefore(p.l.fd.get(), after(2000), "the test listener");
  EXPECT_TRUE(s.ok()) << s.status().toString();
  p.client = std::move(*c);
  p.server = std::move(*s);
  return p;
}

// A port nothing listens on (bound once, then closed).
int closedPort() {
  StatusOr<Listening> l = listenOn(loopback(0), 1);
  EXPECT_TRUE(l.ok());
  return l->port;
}

TEST(Socket, ConnectToANonListeningPortEndsByItsDeadline) {
  const int port = closedPort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  auto t0 = Clock::now();
  StatusOr<Fd> fd = connectTo(address, after(300));  // refused: dialled again until the deadline
  ASSERT_FALSE(fd.ok());
  EXPECT_GE(msSince(t0), 250);
  EXPECT_LT(msSince(t0), 3000);
  EXPECT_TRUE(has(fd.status(), "connect to " + address)) << fd.status().toString();
  EXPECT_TRUE(has(fd.status(), "ms allowed")) << fd.status().toString();
  t0 = Clock::now();
  fd = connectTo(address, after(5000), /*retry_refused=*/false);  // refused: at once
  ASSERT_FALSE(fd.ok());
  EXPECT_LT(msSince(t0), 1000);
  EXPECT_TRUE(has(fd.status(), "nothing listens there")) << fd.status().toString();
}

TEST(Socket, ConnectStartReportsTheRefusal) {
  const sockaddr_in to = loopback(closedPort());
  StatusOr<Fd> fd = connectStart(to, endpointText(to));
  if (!fd.ok()) {  // refused synchronously
    EXPECT_TRUE(has(fd.status(), endpointText(to))) << fd.status().toString();
    return;
  }
  pollfd p{fd->get(), POLLOUT, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  Status st = connectResult(fd->get(), endpointText(to));
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(has(st, "connect to " + endpointText(to))) << st.toString();
}

TEST(Socket, ReadTimesOutNamingThePeerAndTheBytes) {
  Pair p = connected();
  char buf[8];
  auto t0 = Clock::now();
  Status st = readAll(p.client.get(), buf, sizeof(buf), after(200), "the silent peer");
  ASSERT_FALSE(st.ok());
  EXPECT_GE(msSince(t0), 150);
  EXPECT_LT(msSince(t0), 3000);
  EXPECT_TRUE(has(st, "the silent peer: no progress until the deadline (200 ms allowed; 0 of 8"))
      << st.toString();
  ASSERT_TRUE(writeAll(p.server.get(), "abc", 3, after(1000), "client").ok());
  st = readAll(p.client.get(), buf, sizeof(buf), after(200), "the slow peer");
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(has(st, "3 of 8 bytes read")) << st.toString();
}

TEST(Socket, PeerClosingMidMessageIsAnEof) {
  Pair p = connected();
  ASSERT_TRUE(writeAll(p.server.get(), "hello", 5, after(1000), "client").ok());
  p.server.reset();
  char buf[16];
  auto t0 = Clock::now();
  Status st = readAll(p.client.get(), buf, sizeof(buf), after(5000), "member 3 (10.0.0.3:7)");
  ASSERT_FALSE(st.ok());
  EXPECT_LT(msSince(t0), 2000);  // at once, not at the deadline
  EXPECT_TRUE(has(st, "member 3 (10.0.0.3:7): closed the connection (EOF; 5 of 16 bytes read)"))
      << st.toString();
  // Writing to the closed peer is an error (EPIPE or a reset), never a SIGPIPE.
  std::vector<char> big(1 << 20, 'x');
  Status w;
  for (int i = 0; i < 16 && w.ok(); ++i)
    w = writeAll(p.client.get(), big.data(), big.size(), after(2000), "the closed peer");
  ASSERT_FALSE(w.ok());
  EXPECT_TRUE(has(w, "the closed peer: ")) << w.toString();
}

TEST(Socket, WriteAllOfALargeBuffer) {
  Pair p = connected();
  const size_t n = size_t{48} << 20;  // far beyond the socket buffers: many partial sends
  std::vector<char> src(n), dst(n, 0);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<char>(i * 2654435761u >> 11);
  Status read_status;
  std::thread reader(
      [&] { read_status = readAll(p.server.get(), dst.data(), n, after(30000), "the writer"); });
  Status st = writeAll(p.client.get(), src.data(), n, after(30000), "the reader");
  reader.join();
  ASSERT_TRUE(st.ok()) << st.toString();
  ASSERT_TRUE(read_status.ok()) << read_status.toString();
  EXPECT_TRUE(src == dst);
  // Nobody reading: the write stops at its deadline, saying how far it got.
  st = writeAll(p.client.get(), src.data(), n, after(300), "the stalled reader");
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(has(st, "the stalled reader: no progress until the deadline (300 ms allowed; "))
      << st.toString();
  EXPECT_TRUE(has(st, " of " + std::to_string(n) + " bytes written")) << st.toString();
}

TEST(Socket, AcceptEndsByItsDeadline) {
  StatusOr<Listening> l = listenOn(loopback(0), 4);
  ASSERT_TRUE(l.ok()) << l.status().toString();
  EXPECT_GT(l->port, 0);
  auto t0 = Clock::now();
  StatusOr<Fd> fd = acceptBefore(l->fd.get(), after(200), "listener 127.0.0.1");
  ASSERT_FALSE(fd.ok());
  EXPECT_GE(msSince(t0), 150);
  EXPECT_TRUE(has(fd.status(), "listener 127.0.0.1: timed out (no connection within 200 ms)"))
      << fd.status().toString();
}

TEST(Socket, Addresses) {
  std::string host;
  int port = 0;
  ASSERT_TRUE(splitAddress("10.1.2.3:8080", &host, &port).ok());
  EXPECT_EQ(host, "10.1.2.3");
  EXPECT_EQ(port, 8080);
  for (const char* bad : {"nocolon", ":80", "h:", "h:0", "h:65536", "h:8o", "h:123456"})
    EXPECT_FALSE(splitAddress(bad, &host, &port).ok()) << bad;
  EXPECT_EQ(endpointText(loopback(7)), "127.0.0.1:7");
  StatusOr<std::string> local = localAddressToward("http://127.0.0.1:2379");
  ASSERT_TRUE(local.ok()) << local.status().toString();
  EXPECT_EQ(*local, "127.0.0.1");
  EXPECT_EQ(msUntil(Clock::now() - milliseconds(5)), 0);
}

}  // namespace
}  // namespace hsdp::net
