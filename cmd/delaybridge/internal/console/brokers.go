package console

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/delaybridge/delaybridge/internal/broker"
	"github.com/delaybridge/delaybridge/internal/driver"
	"github.com/delaybridge/delaybridge/internal/rabbit"
	"github.com/delaybridge/delaybridge/internal/rocket"
)

type limitRow struct{ Name, Value string }

type brokersData struct {
	Kind   string
	Mode   string
	Limits []limitRow
	Err    string
	Doctor doctorRun
}

// brokerLimits returns the delay limits the broker settings bf put in
// effect, as the adapters compute them, and the rows the brokers page
// shows.
func brokerLimits(bf driver.Settings) (broker.Limits, []limitRow, error) {
	var rows []limitRow
	switch bf.Broker {
	case "rabbit":
		cfg, err := driver.ConfigOf[rabbit.Config](&bf, nil)
		if err != nil {
			return broker.Limits{}, nil, err
		}
		lim, err := cfg.Limits()
		if err != nil {
			return broker.Limits{}, nil, err
		}
		if cfg.Mode == rabbit.ModeDelayedExchange {
			rows = append(rows, limitRow{"plugin", "rabbitmq_delayed_message_exchange (x-delay header)"},
				limitRow{"max delay per hop", fmtDur(lim.MaxHop)}, limitRow{"precision", "the plugin's timer"})
			return lim, rows, nil
		}
		unit, depth := cfg.Unit, cfg.Depth
		if unit <= 0 {
			unit = rabbit.DefaultUnit
		}
		if depth <= 0 {
			depth = rabbit.DefaultDepth
		}
		rows = append(rows, limitRow{"plugin", "none (ladder of quorum queues)"},
			limitRow{"ladder", fmt.Sprintf("prefix %q, unit %v, depth %d", cfg.Prefix, unit, depth)},
			limitRow{"max delay per hop", fmtDur(lim.MaxHop)},
			limitRow{"precision", fmt.Sprintf("%v (unit + %v release lead; early arrivals are held)", lim.Precision, lim.Precision-unit)},
			limitRow{"queue bound", fmt.Sprintf("x-max-length %d", bf.RabbitMaxLength)})
		return lim, rows, nil
	case "rocket":
		cfg, err := driver.ConfigOf[rocket.Config](&bf, nil)
		if err != nil {
			return broker.Limits{}, nil, err
		}
		lead, err := rocket.Lead(cfg)
		if err != nil {
			return broker.Limits{}, nil, err
		}
		lim := cfg.Limits
		lim.Precision += lead
		precision := fmtDur(cfg.Limits.Precision)
		if cfg.Limits.Precision == 0 && len(lim.Levels) == 0 {
			precision = "the brokers' timerPrecisionMs"
		}
		if lead > 0 {
			precision += fmt.Sprintf(" + %v lead (a task's last seconds skip the wheel; early arrivals are held)", lead)
		}
		rows = append(rows, limitRow{"name servers", strings.Join(cfg.NameServers, ", ")},
			limitRow{"max delay per hop", fmtDur(lim.MaxHop)}, limitRow{"precision", precision})
		if len(lim.Levels) > 0 {
			lv := make([]string, len(lim.Levels))
			for i, l := range lim.Levels {
				lv[i] = l.String()
			}
			rows = append(rows, limitRow{"delay levels", strings.Join(lv, " ")})
		}
		return lim, rows, nil
	}
	return broker.Limits{}, nil, fmt.Errorf("--broker %q: want rabbit or rocket", bf.Broker)
}

func (c *console) brokers(w http.ResponseWriter, r *http.Request) {
	d := &brokersData{Kind: c.env.Broker.Broker, Mode: c.env.Broker.Mode(), Doctor: c.lastDoctor()}
	if _, rows, err := brokerLimits(c.env.Broker); err != nil {
		d.Err = err.Error()
	} else {
		d.Limits = rows
	}
	v := view{Title: "Brokers", Data: d}
	if d.Doctor.Running {
		v.Refresh = 2
	}
	c.render(w, r, "brokers", http.StatusOK, v)
}

// brokersCheck starts doctor's checks. They change no task (they probe the
// database and the broker), so a read-only console runs them too.
func (c *console) brokersCheck(w http.ResponseWriter, r *http.Request) {
	if c.startDoctor(who(r)) {
		c.log.Info("console: doctor started", "who", who(r), "remote", r.RemoteAddr)
	}
	http.Redirect(w, r, "/brokers", http.StatusSeeOther)
}
