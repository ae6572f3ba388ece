{{/* Labels of a monitoring object: the chart's labels plus the user's extra ones (monitoring.<object>.labels).
     The chart's own keys win, so an extra label can neither duplicate a key nor move the object out of the
     release. Called with (dict "root" $ "extra" <labels> "fixed" <labels the object must carry>). */}}
{{- define "eos.monitoringLabels" -}}
{{- $labels := merge (dict) (default (dict) .fixed) (include "eos.labels" .root | fromYaml) (default (dict) .extra) -}}
{{- toYaml $labels -}}
{{- end -}}
