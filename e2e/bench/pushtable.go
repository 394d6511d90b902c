package bench

import (
	"fmt"
	"slices"
)

var pushHeader = []string{"push", "target", "msg/s", "CPU µs/msg, process", "CPU µs/msg, PostgreSQL", "cores busy", "vs JetStream", "vs CPU floor"}

// pushRows lists every push measurement, modes and floors, with its CPU cost, and for
// jetgres's modes the ratios to JetStream's same mode and to jetgres's CPU floor: the ack
// CPU floor for ack explicit, whose acks the CPU floor leaves out.
func (rep *Report) pushRows() [][]string {
	find := func(target, mode string) float64 {
		for _, p := range rep.Push {
			if p.Target == target && p.Mode == mode {
				return p.MsgsPerSec
			}
		}
		return 0
	}
	ratio := func(a, b float64) string {
		if a <= 0 || b <= 0 {
			return "—"
		}
		return fmtRatio(a / b)
	}
	us := func(v float64) string {
		if v <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", v)
	}
	var rows [][]string
	for _, mode := range slices.Concat(PushModes, OrderedReads, PushFloors) {
		for _, p := range rep.Push {
			if p.Mode != mode {
				continue
			}
			vsJS, vsFloor := "—", "—"
			if p.Target == TargetJetgres && (slices.Contains(PushModes, mode) || slices.Contains(OrderedReads, mode)) {
				vsJS = ratio(p.MsgsPerSec, find(TargetJetStream, mode))
				// The CPU floor is of messages of the stream's size: an object's chunks have none.
				if mode != PushObjectGet {
					vsFloor = ratio(p.MsgsPerSec, find(TargetJetgres, cpuFloorOf(mode)))
				}
			}
			// The CPU floor's rate is the cores' rate by construction: its cores busy is them.
			busy := fmt.Sprintf("%.2f", (p.CPUUsPerMsg+p.PGCPUUsPerMsg)*p.MsgsPerSec/1e6)
			rows = append(rows, []string{mode, targetLabels[p.Target], fmtRate(p.MsgsPerSec),
				us(p.CPUUsPerMsg), us(p.PGCPUUsPerMsg), busy, vsJS, vsFloor})
		}
	}
	return rows
}

// cpuFloorOf is the CPU floor that bounds a push mode.
func cpuFloorOf(mode string) string {
	if mode == PushAckExplicit {
		return PushAckCPUFloor
	}
	return PushCPUFloor
}
