// What the kernel's tcp_info tells of a TCP connection: how fast it
// delivers what it sends (for the balancer's link rates, engine/link_rate.h)
// and how long the peer has been silent (for path_timeout, engine/silence.h).
//
// Its own file: glibc's <netinet/tcp.h> has a struct tcp_info without the
// delivery rate and the peer's window, and it cannot be included together
// with <linux/tcp.h>.
//
// Thread-agnostic: each call is one getsockopt on the caller's socket.
#pragma once

#include <cstdint>

namespace mpnfs::nfs {

// Bytes per second of the connection's latest delivery sample, or 0 when
// there is none or the kernel marked it limited by the application (too
// little was sent to fill the link: it says nothing of the link).
uint64_t TcpDeliveryRate(int fd);

// Milliseconds since the peer last sent anything on the connection (data or
// a bare ACK), or -1 when the kernel does not say. 0 while the peer's
// receive window is shut (less than one segment, nothing of ours in flight)
// and its kernel answers the window probes TCP sends (all but at most the
// one just sent): TCP hears such a peer only at those probes, whose
// intervals double up to seconds, and it is the server that reads this
// connection slowly, which moving the calls to another path would not cure.
// Once two probes in a row go unanswered, the silence counts from the last
// thing heard, so a path that dies while its window is shut is found after
// the second probe.
int64_t TcpSilentMs(int fd);

}  // namespace mpnfs::nfs
