// Package autorate decides a shaper's rate on a link whose capacity
// changes (LTE, 5G, cable, satellite, Wi-Fi backhaul): as high as the
// link carries without its own buffer filling.
//
// The signal is delay: replies from reflectors (hosts that answer ICMP
// echo or timestamp requests) are held against each reflector's
// baseline, the delay it shows when the link's buffer is empty. When
// several recent samples lie well above their baselines the link's
// buffer is filling, and the rate comes down; when the shaper is busy
// and the delay stays low, it goes up; otherwise it drifts back toward a
// base rate. No replies means nothing is known: the rate stays (a radio
// blackout or a dead set of reflectors is never read as bufferbloat).
//
// The rules and their defaults are cake-autorate's (v3.5); Config names
// each. The package is pure: a Controller is fed samples and counters
// with their times and returns decisions, so tests drive it with a fake
// clock and recorded delay series. Probing and writing the rate belong
// to the agent, which writes through the engine session as every other
// writer does.
//
// It must not touch the kernel, the network or the clock.
package autorate
