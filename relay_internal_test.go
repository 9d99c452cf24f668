package delaybridge

import (
	"reflect"
	"testing"
)

// Every field of the public RelayConfig reaches the relay's own, under
// the same name: a field added to one and not carried is caught here.
func TestRelayConfig_CarriesEveryFieldToTheRelay(t *testing.T) {
	var in RelayConfig
	v := reflect.ValueOf(&in).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(1000 + i))
		case reflect.Float64:
			f.SetFloat(float64(1000+i) + 0.5)
		case reflect.Slice:
			f.Set(reflect.ValueOf([]string{"t"}))
		case reflect.Pointer:
			f.Set(reflect.New(f.Type().Elem()))
		case reflect.Map:
			f.Set(reflect.ValueOf(map[string]float64{"t": float64(1000+i) + 0.5}))
		default:
			t.Fatalf("field %s: kind %s not covered by this test", v.Type().Field(i).Name, f.Kind())
		}
	}
	out := reflect.ValueOf(in.outbox())
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		got := out.FieldByName(name)
		if !got.IsValid() {
			t.Errorf("the relay's config has no field %s", name)
			continue
		}
		if !reflect.DeepEqual(got.Interface(), v.Field(i).Interface()) {
			t.Errorf("%s: relay got %v, want %v", name, got.Interface(), v.Field(i).Interface())
		}
	}
}
