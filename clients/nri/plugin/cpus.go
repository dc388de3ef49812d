package plugin

import (
	"sort"
	"strconv"
	"strings"
)

// formatCPUList writes CPUs as Linux writes them in cpuset files: "0-3,8,10-11".
func formatCPUList(cpus []int) string {
	if len(cpus) == 0 {
		return ""
	}
	s := append([]int(nil), cpus...)
	sort.Ints(s)
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(s[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(s[j]))
		}
		i = j + 1
	}
	return b.String()
}

// ParseCPUList reads a Linux CPU list such as "0-3,8".
func ParseCPUList(text string) ([]int, error) {
	var cpus []int
	for _, part := range strings.Split(strings.TrimSpace(text), ",") {
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, err
			}
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// without returns the CPUs of all that are not in taken, ascending.
func without(all []int, taken map[int]bool) []int {
	var out []int
	for _, c := range all {
		if !taken[c] {
			out = append(out, c)
		}
	}
	sort.Ints(out)
	return out
}
