package bdi

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestPacerBucket: the bucket starts a pace with paceBurst of it, refills
// at the pace up to that depth, may be overdrawn by a start, and reports a
// period as held back only when a start was refused and it never filled.
func TestPacerBucket(t *testing.T) {
	var p pacer
	if got := p.room(0, 0); got < 1<<60 {
		t.Fatalf("no pace: room %d, want no bound", got)
	}
	const rate = 40 * mib
	depth := int64(rate * paceBurst.Seconds()) // 2 MiB
	p.setRate(0, rate)
	steps := []struct {
		at      time.Duration
		take    int64
		room    int64 // after the take
		limited bool  // period() right after, when checked
		check   bool
	}{
		{at: 0, take: 0, room: depth},
		{at: 0, take: 3 * mib, room: 0, check: true},        // overdrawn by 1 MiB: refused (the bucket was full at 0)
		{at: 25 * time.Millisecond, take: 0, room: 0},       // 1 MiB back: 0 tokens
		{at: 50 * time.Millisecond, take: 0, room: 1 * mib}, // 1 MiB
		{at: 50 * time.Millisecond, take: 0, room: 1 * mib, limited: true, check: true},
		{at: time.Second, take: 0, room: depth}, // full again, never more than the depth
		{at: time.Second, take: 0, room: depth, limited: false, check: true},
	}
	for i, s := range steps {
		p.take(s.at, s.take)
		if got := p.room(s.at, 0); got != s.room {
			t.Fatalf("step %d at %v: room %d, want %d", i, s.at, got, s.room)
		}
		if s.check {
			if got := p.period(s.at); got != s.limited {
				t.Fatalf("step %d at %v: period limited %v, want %v", i, s.at, got, s.limited)
			}
		}
	}
	// A caller back every 100 ms borrows the 50 ms past the depth.
	if got, want := p.room(time.Second, 100*time.Millisecond), depth+2*mib; got != want {
		t.Fatalf("room for a 100 ms span %d, want %d", got, want)
	}
	p.setRate(time.Second, 0)
	if got := p.room(2*time.Second, 0); got < 1<<60 {
		t.Fatalf("pace off: room %d, want no bound", got)
	}
}

// TestPacerHeld: a caller back every 100 ms that takes what room gives
// finds the bucket full at each refill, so a period counts as held by the
// pace only when a start was cut short (held); no pace, nothing is held.
func TestPacerHeld(t *testing.T) {
	var p pacer
	p.held()
	if p.period(0) {
		t.Fatal("no pace: a held start counted")
	}
	const rate = 16 * mib
	p.setRate(0, rate)
	span := 100 * time.Millisecond
	at := time.Duration(0)
	for i := range 3 {
		at += span
		p.take(at, p.room(at, span))
		if p.period(at) {
			t.Fatalf("check %d: limited without a start cut short", i)
		}
	}
	at += span
	p.take(at, p.room(at, span))
	p.held()
	if !p.period(at) {
		t.Fatal("a start cut short by the pace: the period is not counted as held by it")
	}
	if p.period(at + span) {
		t.Fatal("the next period, nothing cut: still counted")
	}
}

// TestPacerOwed: a start refused keeps the pace owed to it up to paceOwed
// however late it comes back; once it takes, the depth is paceBurst again.
func TestPacerOwed(t *testing.T) {
	var p pacer
	const rate = 40 * mib
	p.setRate(0, rate)
	p.take(0, int64(rate*paceBurst.Seconds())) // empty
	if got := p.room(0, 0); got != 0 {
		t.Fatalf("room %d after taking the bucket, want 0", got)
	}
	if got, want := p.room(time.Second, 0), int64(rate*paceOwed.Seconds()); got != want {
		t.Fatalf("a refused start back after 1 s: room %d, want %d (paceOwed of the pace)", got, want)
	}
	p.take(time.Second, 1*mib)
	if got, want := p.room(2*time.Second, 0), int64(rate*paceBurst.Seconds()); got != want {
		t.Fatalf("after a take, a second later: room %d, want %d (the depth)", got, want)
	}
}

// paceSample is the pace at an update and the device's rate then.
type paceSample struct {
	at         time.Duration
	pace, rate float64
}

// simulatePace drives a paceControl in virtual time against a device whose
// write rate follows capacity(t), flusherd always having more to write than
// demand(t) allows (0: no end): every bandwidthInterval, a pace over the
// device's rate (or none) leaves flusherd's writeback waiting in the
// device's queue (the window holds it back, and every other period the
// pace too; the device writes at its rate); a pace under it holds
// flusherd back (the device writes the pace).
func simulatePace(t *testing.T, total time.Duration, capacity, demand func(time.Duration) float64) []paceSample {
	t.Helper()
	var out []paceSample
	synctest.Test(t, func(t *testing.T) {
		var c paceControl
		pace := c.pace()
		start := time.Now()
		for time.Since(start) < total {
			time.Sleep(bandwidthInterval)
			at := time.Since(start)
			cap, want := capacity(at), demand(at)
			var rate float64
			var wl, pl bool
			switch {
			case want > 0 && want < cap && (pace <= 0 || want < pace):
				rate = want // flusherd has less to write than either allows
			case pace > 0 && pace < cap:
				rate, pl = pace, true
			default:
				// Every other period the pace holds flusherd back too:
				// its bucket's bursts fill the window while the device
				// lags (as seen on a throttled loop device).
				rate, wl = cap, true
				pl = pace > 0 && int(at/bandwidthInterval)%2 == 0
			}
			pace = c.update(bandwidthInterval, uint64(rate), wl, pl)
			out = append(out, paceSample{at: at, pace: pace, rate: cap})
		}
	})
	return out
}

func constant(v float64) func(time.Duration) float64 { return func(time.Duration) float64 { return v } }

// TestPaceConverges: on a 40, 10 and 400 MiB/s device the pace settles at
// paceGain of the device's rate within two seconds (slow start, then the
// estimate) and stays there: under the device's rate, so its queue drains.
func TestPaceConverges(t *testing.T) {
	for _, capMiB := range []float64{40, 10, 400} {
		cap := capMiB * mib
		for _, s := range simulatePace(t, 30*time.Second, constant(cap), constant(0)) {
			if s.at < 2*time.Second {
				continue
			}
			if s.pace < 0.75*cap || s.pace > 0.85*cap {
				t.Errorf("%.0f MiB/s: at %v the pace is %.1f MiB/s, want about %.0f", capMiB, s.at, s.pace/mib, paceGain*capMiB)
				break
			}
		}
	}
}

// TestPaceSlowStartOvershoot: the slow start passes the device's rate
// for paceLearn at most: the periods in which the device could not keep
// up with the pace make the estimate, whether or not the pace held
// flusherd back too.
func TestPaceSlowStartOvershoot(t *testing.T) {
	for _, capMiB := range []float64{40, 10, 400} {
		cap := capMiB * mib
		over := 0
		for _, s := range simulatePace(t, 5*time.Second, constant(cap), constant(0)) {
			if s.pace > cap {
				over++
			}
		}
		if limit := int(paceLearn / bandwidthInterval); over > limit {
			t.Errorf("%.0f MiB/s: the pace was over the device's rate for %d periods, want at most %d", capMiB, over, limit)
		}
	}
}

// TestPaceBacksOffAndRecovers: when the device slows to a quarter (another
// load takes it) the pace comes under its new rate within two seconds;
// when the device is back, the next probe finds it and the pace returns.
func TestPaceBacksOffAndRecovers(t *testing.T) {
	capacity := func(at time.Duration) float64 {
		if at >= 5*time.Second && at < 10*time.Second {
			return 10 * mib
		}
		return 40 * mib
	}
	ss := simulatePace(t, 2*paceProbeEvery, capacity, constant(0))
	var backOff, recovered time.Duration
	for _, s := range ss {
		if s.at > 5*time.Second && backOff == 0 && s.pace < 10*mib {
			backOff = s.at
		}
		if s.at >= 10*time.Second && recovered == 0 && s.pace > 30*mib {
			recovered = s.at
		}
		if s.at >= 8*time.Second && s.at < 10*time.Second && s.pace > 10*mib {
			t.Errorf("at %v (device at 10 MiB/s) the pace is %.1f MiB/s", s.at, s.pace/mib)
		}
	}
	if backOff == 0 || backOff > 7*time.Second {
		t.Errorf("the pace came under the slowed device's rate at %v, want by 7s", backOff)
	}
	if recovered == 0 || recovered > 10*time.Second+paceProbeEvery+time.Second {
		t.Errorf("the pace was back over 30 MiB/s at %v, want within a probe interval of 10s", recovered)
	}
}

// TestPaceFloor: on a device slower than paceMin the pace stays at
// paceMin: writeback is never starved.
func TestPaceFloor(t *testing.T) {
	for _, s := range simulatePace(t, 10*time.Second, constant(256<<10), constant(0)) {
		if s.pace < paceMin {
			t.Fatalf("at %v the pace is %.0f B/s, under the floor %d", s.at, s.pace, paceMin)
		}
	}
}

// TestPaceLightWriter: a writer slower than the device (flusherd held by
// neither the pace nor the window) neither lowers the estimate nor makes
// one: what flusherd gives the device says nothing of its speed.
func TestPaceLightWriter(t *testing.T) {
	demand := func(at time.Duration) float64 {
		if at < 5*time.Second {
			return 0 // a backlog: the estimate is made
		}
		return 5 * mib
	}
	ss := simulatePace(t, 20*time.Second, constant(40*mib), demand)
	if last := ss[len(ss)-1]; last.pace < 0.75*40*mib {
		t.Errorf("after 15 s of a 5 MiB/s writer the pace is %.1f MiB/s, want it kept near %.0f", last.pace/mib, paceGain*40)
	}
	ss = simulatePace(t, 5*time.Second, constant(40*mib), constant(5*mib))
	if last := ss[len(ss)-1]; last.pace != paceStart {
		t.Errorf("a 5 MiB/s writer alone: pace %.1f MiB/s, want the slow start's first %d MiB/s", last.pace/mib, paceStart>>20)
	}
}

// TestPaceUpdateTable: single updates from given states.
func TestPaceUpdateTable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		c      paceControl
		rate   float64
		wl, pl bool
		want   paceControl
	}{
		{name: "slow start doubles when the pace holds", c: paceControl{}, rate: 16 * mib, pl: true,
			want: paceControl{ss: 32 * mib}},
		{name: "slow start: the device could not keep up with the pace, window and pace held", c: paceControl{ss: 64 * mib}, rate: 40 * mib, wl: true, pl: true,
			want: paceControl{ss: 64 * mib, avgT: bandwidthInterval, avgB: 8 * mib}},
		{name: "slow start: a second such period makes the estimate", c: paceControl{ss: 64 * mib, avgT: bandwidthInterval, avgB: 8 * mib}, rate: 30 * mib, wl: true, pl: true,
			want: paceControl{ss: 64 * mib, est: 35 * mib}},
		{name: "slow start: window and pace hold, the device keeps up with the pace", c: paceControl{ss: 32 * mib}, rate: 31 * mib, wl: true, pl: true,
			want: paceControl{ss: 32 * mib}},
		{name: "first window-held period is not enough", c: paceControl{ss: 40 * mib}, rate: 40 * mib, wl: true,
			want: paceControl{ss: 40 * mib, avgT: bandwidthInterval, avgB: 8 * mib}},
		{name: "second makes the estimate", c: paceControl{ss: 40 * mib, avgT: bandwidthInterval, avgB: 6 * mib}, rate: 40 * mib, wl: true,
			want: paceControl{ss: 40 * mib, est: 35 * mib}},
		{name: "paced: held by the pace counts toward a probe", c: paceControl{est: 40 * mib}, rate: 32 * mib, pl: true,
			want: paceControl{est: 40 * mib, paced: bandwidthInterval}},
		{name: "paced: a probe is due", c: paceControl{est: 40 * mib, paced: paceProbeEvery - bandwidthInterval}, rate: 32 * mib, pl: true,
			want: paceControl{est: 40 * mib, paced: paceProbeEvery, probe: true}},
		{name: "probe finds a faster device", c: paceControl{est: 40 * mib, probe: true, paced: paceProbeEvery}, rate: 48 * mib, pl: true,
			want: paceControl{est: 48 * mib, probe: true}},
		{name: "probe finds the same device", c: paceControl{est: 40 * mib, probe: true}, rate: 40 * mib, wl: true,
			want: paceControl{est: 40 * mib}},
		{name: "probe with too little to write", c: paceControl{est: 40 * mib, probe: true}, rate: 10 * mib,
			want: paceControl{est: 40 * mib}},
		{name: "window-held second makes a new estimate", c: paceControl{est: 40 * mib, avgT: 4 * bandwidthInterval, avgB: 16 * mib}, rate: 20 * mib, wl: true,
			want: paceControl{est: 20 * mib}},
		{name: "window and pace hold, the device short of the pace: counts toward a new estimate", c: paceControl{est: 50 * mib}, rate: 30 * mib, wl: true, pl: true,
			want: paceControl{est: 50 * mib, avgT: bandwidthInterval, avgB: 6 * mib}},
		{name: "window and pace hold, the device keeps up with the pace: not a new estimate", c: paceControl{est: 40 * mib}, rate: 33 * mib, wl: true, pl: true,
			want: paceControl{est: 40 * mib, paced: bandwidthInterval}},
		{name: "a light period starts the average again", c: paceControl{est: 40 * mib, avgT: 4 * bandwidthInterval, avgB: 16 * mib}, rate: 5 * mib,
			want: paceControl{est: 40 * mib}},
	} {
		c := tc.c
		c.update(bandwidthInterval, uint64(tc.rate), tc.wl, tc.pl)
		if c != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, c, tc.want)
		}
	}
}
