// The kernel's latest estimate of how fast a TCP connection delivers what
// it sends (tcp_info's delivery rate), for the balancer's link rates
// (engine/link_rate.h).
//
// Its own file: glibc's <netinet/tcp.h> has a struct tcp_info without the
// delivery rate, and it cannot be included together with <linux/tcp.h>.
#pragma once

#include <cstdint>

namespace mpnfs::nfs {

// Bytes per second of the connection's latest delivery sample, or 0 when
// there is none or the kernel marked it limited by the application (too
// little was sent to fill the link: it says nothing of the link).
uint64_t TcpDeliveryRate(int fd);

}  // namespace mpnfs::nfs
